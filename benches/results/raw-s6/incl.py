#!/usr/bin/env python3
# Inclusive profile from a --call-graph dwarf perf.data, symbols from nm.
# usage: incl.py data binary comms N [filter-regex]
import subprocess, sys, bisect, collections, re
data, binary = sys.argv[1], sys.argv[2]
comms = sys.argv[3].split(',') if sys.argv[3] else None
top = int(sys.argv[4])
filt = re.compile(sys.argv[5]) if len(sys.argv) > 5 else None
syms = []
for line in subprocess.run(['nm', '-C', '--defined-only', binary], capture_output=True, text=True).stdout.splitlines():
    parts = line.split(' ', 2)
    if len(parts) == 3 and parts[1] in 'tTwW':
        try: syms.append((int(parts[0], 16), parts[2]))
        except ValueError: pass
syms.sort(); addrs = [a for a, _ in syms]
for l in subprocess.run(['readelf', '-lW', binary], capture_output=True, text=True).stdout.splitlines():
    t = l.split()
    if t and t[0] == 'LOAD' and 'E' in t[-2:-1] + t[-3:-1]:
        seg = (int(t[1], 16), int(t[2], 16))
bname = binary.split('/')[-1]
bases = {}
mm = subprocess.run(['perf', 'script', '-i', data, '--show-mmap-events', '-F', 'pid'], capture_output=True, text=True).stdout
for l in mm.splitlines():
    if 'MMAP' in l and l.rstrip().endswith('/' + bname) and 'r-xp' in l:
        m = re.search(r'(\d+)/\d+: \[(0x[0-9a-f]+)\((0x[0-9a-f]+)\) @ (0x[0-9a-f]+|0)', l)
        if m: bases[m.group(1)] = (int(m.group(2), 16), int(m.group(4), 16))
out = subprocess.run(['perf', 'script', '-i', data, '-F', 'comm,pid,ip,sym,dso'], capture_output=True, text=True).stdout
def res(pid, ip, sym, dso):
    if dso.endswith('/' + bname) and pid in bases:
        start, pgoff = bases[pid]
        a = int(ip, 16) - start + pgoff - seg[0] + seg[1]
        i = bisect.bisect_right(addrs, a) - 1
        n = syms[i][1] if i >= 0 else '??'
        return re.sub(r'::h[0-9a-f]{16}$', '', n)[:130]
    s = sym.strip()
    return (s if s and s != '[unknown]' else '?') + ' [' + dso.split('/')[-1] + ']'
incl = collections.Counter(); total = 0
cur = None
def flush():
    global total
    if cur is None: return
    comm, pid, frames = cur
    if comms and not any(comm.startswith(c) for c in comms): return
    total += 1
    for n in set(frames): incl[n] += 1
for line in out.splitlines():
    if not line.strip():
        flush(); cur = None; continue
    if not line.startswith((' ', '\t')):
        flush()
        m = re.match(r'\s*(.*?)\s+(\d+)\s*$', line) or re.match(r'\s*(.*?)\s+(\d+)\s', line)
        cur = (m.group(1), m.group(2), []) if m else None
        continue
    if cur is None: continue
    m = re.match(r'\s*([0-9a-f]+)\s+(.*)\((.*)\)\s*$', line)
    if m: cur[2].append(res(cur[1], m.group(1), m.group(2), m.group(3)))
flush()
print('total samples', total)
n = 0
for k, v in incl.most_common():
    if filt and not filt.search(k): continue
    print(f'{100*v/total:6.2f}% {k}')
    n += 1
    if n >= top: break
