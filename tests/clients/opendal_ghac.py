"""OpenDAL's `ghac` service (PyPI `opendal`) against a cache server, configured from the
environment as in a workflow (ACTIONS_RUNTIME_TOKEN, ACTIONS_RESULTS_URL or ACTIONS_CACHE_URL,
ACTIONS_CACHE_SERVICE_V2). Run by tests/opendal_ghac.rs:

    python opendal_ghac.py DIR SIZE...

For each SIZE, writes DIR/data-SIZE's bytes once whole (`Operator.write`) and once through
the streamed writer (`Operator.open(path, "wb")`, 256 KiB writes), reads both back into
DIR/read-SIZE and DIR/streamed-SIZE, and checks that a path never written is not found.
Prints `RESULT {...}` last.
"""

import json
import os
import sys

import opendal


def main():
    out_dir, sizes = sys.argv[1], [int(s) for s in sys.argv[2:]]
    op = opendal.Operator("ghac", root="/hoard-test")
    result = {"sizes": sizes}
    for size in sizes:
        with open(os.path.join(out_dir, f"data-{size}"), "rb") as f:
            data = f.read()
        op.write(f"whole-{size}", data)
        with op.open(f"streamed-{size}", "wb") as w:
            for start in range(0, len(data), 256 * 1024):
                w.write(data[start : start + 256 * 1024])
        for name, path in [("read", f"whole-{size}"), ("streamed", f"streamed-{size}")]:
            with open(os.path.join(out_dir, f"{name}-{size}"), "wb") as f:
                f.write(op.read(path))
    try:
        op.read("never-written")
        result["miss"] = "found"
    except opendal.exceptions.NotFound:
        result["miss"] = "not found"
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
