# Times Put Block requests as an upload's staged blocks grow (issue #25: the 10,000th block
# must cost what the 10th does): BLOCKS (default 10,000) blocks of 1 KiB on one upload over one
# keep-alive connection, then one block id re-sent 20 times; prints medians of 20 requests.
#   python3 scripts/put-block-times.py PORT SECRET [BLOCKS]
# against `hoard serve --token-hs256-secret-file FILE` whose FILE holds SECRET (see
# scripts/count-instructions for the same set-up).
import base64, statistics, sys, time

from hoard_load import Hoard

port, secret = int(sys.argv[1]), sys.argv[2]
blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
hoard = Hoard(port, secret)
conn = hoard.conn
path = hoard.upload_path(f"blocks-{time.time_ns()}")
data = b"x" * 1024
times = []
def put(i):
    bid = base64.b64encode(f"{i:032d}".encode()).decode()
    t = time.perf_counter()
    conn.request("PUT", f"{path}&comp=block&blockid={bid}", data, {"Content-Length": str(len(data))})
    r = conn.getresponse(); r.read()
    assert r.status == 201, (r.status, i)
    return (time.perf_counter() - t) * 1000
for i in range(blocks):
    times.append(put(i))
early = statistics.median(times[5:25])
late = statistics.median(times[-20:])
resent = statistics.median([put(blocks // 2) for _ in range(20)])
for lo in [x for x in (5, 100, 1000, 5000) if x + 20 <= len(times)]:
    print(f"  blocks {lo+1}-{lo+20}: {statistics.median(times[lo:lo+20]):.3f} ms")
print(f"Put Block, 1 KiB, median ms: blocks 6-25 {early:.3f}; blocks {blocks-19}-{blocks} {late:.3f} ({late/early:.2f}x); block {blocks//2} re-sent at {blocks} staged {resent:.3f} ({resent/early:.2f}x)")
