#!/usr/bin/env python3
# Sum call counts and inclusive cost of calls to functions matching a regex, from a
# callgrind file written with --compress-strings=no (or compressed: names resolved).
# usage: calls.py file.cg regex [regex...]
import re,sys,collections
f=sys.argv[1]; pats=[re.compile(p) for p in sys.argv[2:]]
names={}
def name(s):
    m=re.match(r'\((\d+)\)(?: (.*))?',s)
    if m:
        if m.group(2): names[m.group(1)]=m.group(2)
        return names.get(m.group(1),s)
    return s
calls=collections.Counter(); incl=collections.Counter()
cur=None; cfn=None; pending=None; fn=None
for line in open(f):
    line=line.rstrip('\n')
    if line.startswith('fn='): fn=name(line[3:])
    elif line.startswith('cfn='): cfn=name(line[4:])
    elif line.startswith('calls='):
        pending=int(line[6:].split()[0])
    elif pending is not None and line and (line[0].isdigit() or line[0] in '+-*'):
        parts=line.split()
        cost=int(parts[1]) if len(parts)>1 else 0
        if fn!=cfn:
            for p in pats:
                if p.search(cfn): calls[(p.pattern,cfn)]+=pending; incl[(p.pattern,cfn)]+=cost
        pending=None
for k in sorted(calls):
    print(f"{calls[k]:10d} calls {incl[k]:14d} Ir  {k[1][:140]}")
