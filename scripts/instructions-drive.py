# The load of scripts/count-instructions: N lookups or N small saves (1 KiB) over one
# keep-alive connection, with an HS256 token signed by SECRET. `seed` saves the 8 entries the
# lookups find.
#   python3 instructions-drive.py PORT SECRET seed|lookups|restores|saves N
# `lookups` asks for an exact key; `restores` asks for a key that misses with a restore key that
# finds a seeded entry by its prefix (as a run whose lock file changed).
import base64, hashlib, hmac, http.client, json, sys, time

port, secret, mode, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
claims = {"ac": json.dumps([{"Scope": "refs/heads/main", "Permission": 3}]), "repository_id": "1",
          "exp": int(time.time()) + 3600, "sub": "bench"}
body = b64(json.dumps(claims).encode())
sig = b64(hmac.new(secret.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest())
token = f"{header}.{body}.{sig}"
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
SVC = "/twirp/github.actions.results.api.v1.CacheService/"
V = "3ad75f27293d65a135214b8c82b296080f911dc107e52f1e7ec871a2eda46e69"

def twirp(method, req):
    conn.request("POST", SVC + method, json.dumps(req), {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    r = conn.getresponse(); data = r.read()
    assert r.status == 200, (method, r.status, data)
    return json.loads(data)

def save(key):
    url = twirp("CreateCacheEntry", {"key": key, "version": V})["signed_upload_url"]
    path = url[url.index("/_blob"):]
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
