#!/usr/bin/env bash
# A 50 MB CSV read by pandas from a lent folder (/data) and from /workspace, in one guest run:
# the median of three reads each, and their ratio (issue #34's goal: within 1.5x).
# Usage: benches/mount_read.sh [path/to/wasmbox]
set -euo pipefail
bin=${1:-target/release/wasmbox}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir/sales.csv" <<'PY'
import random, sys
random.seed(1)
with open(sys.argv[1], 'w') as f:
    f.write('id,region,amount,price,qty\n')
    i = 0
    while f.tell() < 50_000_000:
        f.write(f'{i},r{random.randint(0, 50)},{random.random() * 1000:.3f},{random.random() * 100:.2f},{random.randint(1, 99)}\n')
        i += 1
PY
WASMBOX_ONESHOT_DISK_MB=512 "$bin" run --timeout 300 --mount "$dir:/data/big" --code "
import time, shutil, pandas as pd
shutil.copy('/data/big/sales.csv', '/workspace/sales.csv')
ts = {'data': [], 'workspace': []}
for _ in range(3):
    for where, p in (('data', '/data/big/sales.csv'), ('workspace', '/workspace/sales.csv')):
        t = time.perf_counter(); df = pd.read_csv(p); ts[where].append(time.perf_counter() - t)
m = {k: round(sorted(v)[1], 3) for k, v in ts.items()}
print(f'{len(df)} rows; median read: /data {m[\"data\"]} s, /workspace {m[\"workspace\"]} s; ratio {m[\"data\"] / m[\"workspace\"]:.2f}')
"
