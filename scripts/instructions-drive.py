# The load of scripts/count-instructions: N lookups or N small saves (1 KiB) over one
# keep-alive connection, with an HS256 token signed by SECRET. `seed` saves the 8 entries the
# lookups find.
#   python3 instructions-drive.py PORT SECRET seed|lookups|restores|saves N
# `lookups` asks for an exact key; `restores` asks for a key that misses with a restore key that
# finds a seeded entry by its prefix (as a run whose lock file changed).
import sys, time

from hoard_load import V, Hoard

port, secret, mode, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
hoard = Hoard(port, secret)
conn, twirp = hoard.conn, hoard.twirp

def save(key):
    path = hoard.upload_path(key)
    conn.request("PUT", path, b"x" * 1024, {"x-ms-blob-type": "BlockBlob"})
    r = conn.getresponse(); r.read(); assert r.status == 201, r.status
    assert twirp("FinalizeCacheEntryUpload", {"key": key, "version": V, "size_bytes": "1024"})["ok"]

if mode == "seed":
    for i in range(8): save(f"seed-{i}")
elif mode == "lookups":
    for i in range(n):
        assert twirp("GetCacheEntryDownloadURL", {"key": f"seed-{i % 8}", "version": V})["ok"]
elif mode == "restores":
    for i in range(n):
        req = {"key": f"seed-{i % 8}-changed", "restore_keys": [f"seed-{i % 8}"], "version": V}
        assert twirp("GetCacheEntryDownloadURL", req)["matched_key"] == f"seed-{i % 8}"
elif mode == "saves":
    for i in range(n): save(f"small-{time.time_ns()}-{i}")
