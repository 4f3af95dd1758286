#!/usr/bin/env python3
# Instructions per op from callgrind pairs: reads *.out summary lines "NAME-N summary: X"
# or per-thread "NAME-N FILE summary: X" (thread file -01 only).
import re,sys,glob,collections
runs=collections.defaultdict(dict)
for f in sys.argv[1:]:
    for line in open(f):
        m=re.match(r'(\S+)-(\d+)(?: (\S+))? summary: (\d+)',line)
        if not m: continue
        name,n,tf,x=m.group(1),int(m.group(2)),m.group(3),int(m.group(4))
        if tf and not tf.endswith('-01'): continue
        runs[name][n]=x
for name,d in runs.items():
    if len(d)>=2:
        (a,xa),(b,xb)=sorted(d.items())[:2]
        print(f"{name:40s} {(xb-xa)/(b-a):12.1f} instr/op  (n {a}->{b})")
