#!/bin/bash
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../../.." && pwd)
work=$(mktemp -d); cd "$work"; cp "$here"/*.py .
export DYN_FILE_KV=$work/kv DYN_TCP_RPC_HOST=127.0.0.1 DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_LOG=error NO_COLOR=1 DYN_SYSTEM_HOST=127.0.0.1 DYN_EVENT_PLANE_HOST=127.0.0.1
rm -rf kv; mkdir kv
PY=$root/.venv/bin/python
$PY worker.py > w1.log 2>&1 & echo $! > w1.pid
$PY worker.py > w2.log 2>&1 & echo $! > w2.pid
sleep 3
timeout 120 $PY client.py > client.log 2>&1
echo "rc=$?" >> client.log
kill $(cat w1.pid) $(cat w2.pid)
