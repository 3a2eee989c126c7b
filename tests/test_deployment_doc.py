"""docs/deployment.md runs as written: its shell blocks, in order, from the checkout's root.

The install block is the README's (CI runs it); the etcd blocks run only where etcd is
installed (required in CI). Workers started in the background are ended by the script.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.etcd_server import etcd_binary

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "deployment.md"
SHELL_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)
PRELUDE = "set -euo pipefail\ntrap 'kill $(jobs -p) 2> /dev/null || true' EXIT\n"
SCRIPT_TIMEOUT = 120


def _blocks(*, etcd: bool) -> list[str]:
    blocks = SHELL_BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    return [b for b in blocks if "pip install" not in b and ("etcd" in b) == etcd]


def _run(blocks: list[str], tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "DYN_FILE_KV"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the venv's routespec
    env["TMPDIR"] = str(tmp_path)  # a fresh default file store
    done = subprocess.run(
        ["bash", "-c", PRELUDE + "\n".join(blocks)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_file_store_walkthrough_runs_as_written(tmp_path: Path) -> None:
    output = _run(_blocks(etcd=False), tmp_path)
    assert "demo/tokens/generate: 2 discovered, 2 routable, 0 overloaded" in output
    assert '{"token_ids": [7], "finish_reason": "length"}' in output  # the first call's last
    assert '{"request": 1, "done": true}' in output
    assert "routespec_worker_requests_started_total" in output
    assert "conformance of adapter 'reference'" in output


def test_the_etcd_walkthrough_runs_as_written(tmp_path: Path) -> None:
    etcd_binary()  # skip without etcd (fail in CI, which requires it)
    output = _run(_blocks(etcd=True), tmp_path)
    assert "demo/tokens/generate: 1 discovered, 1 routable, 0 overloaded" in output
    assert '{"token_ids": [3], "finish_reason": "length"}' in output


@pytest.mark.parametrize("etcd", [False, True])
def test_the_page_has_the_blocks_the_tests_run(etcd: bool) -> None:
    assert _blocks(etcd=etcd)
