#!/usr/bin/env python3
# Flat self-time profile of perf.data with symbols from nm (perf 6.1 fails to
# resolve this binary's symbols). usage: flat.py data binary comm1,comm2 N [pid]
import subprocess, sys, bisect, collections, re
data, binary = sys.argv[1], sys.argv[2]
comms = sys.argv[3].split(',') if len(sys.argv) > 3 and sys.argv[3] else None
top = int(sys.argv[4]) if len(sys.argv) > 4 else 40
onlypid = sys.argv[5] if len(sys.argv) > 5 else None
syms = []
for line in subprocess.run(['nm', '-C', '--defined-only', binary], capture_output=True, text=True).stdout.splitlines():
    parts = line.split(' ', 2)
    if len(parts) == 3 and parts[1] in 'tTwW':
        try: syms.append((int(parts[0], 16), parts[2]))
        except ValueError: pass
syms.sort()
addrs = [a for a, _ in syms]
seg = None
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
out = subprocess.run(['perf', 'script', '-i', data, '-F', 'comm,pid,ip,sym,dso', '-G'], capture_output=True, text=True).stdout
cnt = collections.Counter(); total = 0
for line in out.splitlines():
    m = re.match(r'\s*(.*?)\s+(\d+)\s+([0-9a-f]+)\s*(.*)\((.*)\)\s*$', line)
    if not m: continue
    comm, pid, ip, sym, dso = m.groups()
    if comms and not any(comm.startswith(c) for c in comms): continue
    if onlypid and pid != onlypid: continue
    total += 1
    if dso.endswith('/' + bname) and pid in bases:
        start, pgoff = bases[pid]
        a = int(ip, 16) - start + pgoff - seg[0] + seg[1]
        i = bisect.bisect_right(addrs, a) - 1
        name = syms[i][1] if i >= 0 else '??'
        name = re.sub(r'::h[0-9a-f]{16}$', '', name)
        cnt[name[:120]] += 1
    else:
        s = sym.strip()
        cnt[(s if s and s != '[unknown]' else ip)[:80] + ' [' + dso.split('/')[-1] + ']'] += 1
print('total samples', total)
for k, v in cnt.most_common(top):
    print(f'{100*v/total:6.2f}% {k}')
