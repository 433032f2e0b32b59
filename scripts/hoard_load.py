# What the load scripts (instructions-drive.py, put-block-times.py) share: one keep-alive
# connection to a hoard on 127.0.0.1 with an HS256 runtime token of repository 1 on
# refs/heads/main signed by SECRET, and Twirp calls through it.
import base64, hashlib, hmac, http.client, json, time

SVC = "/twirp/github.actions.results.api.v1.CacheService/"
V = "3ad75f27293d65a135214b8c82b296080f911dc107e52f1e7ec871a2eda46e69"


def _b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class Hoard:
    def __init__(self, port, secret):
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        claims = {"ac": json.dumps([{"Scope": "refs/heads/main", "Permission": 3}]),
                  "repository_id": "1", "exp": int(time.time()) + 3600, "sub": "bench"}
        body = _b64(json.dumps(claims).encode())
        sig = _b64(hmac.new(secret.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest())
        self.token = f"{header}.{body}.{sig}"
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def twirp(self, method, req):
        self.conn.request("POST", SVC + method, json.dumps(req),
                          {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        r = self.conn.getresponse(); data = r.read()
        assert r.status == 200, (method, r.status, data)
        return json.loads(data)

    def upload_path(self, key):
        """Reserves `key` and returns the path of its signed upload link."""
        url = self.twirp("CreateCacheEntry", {"key": key, "version": V})["signed_upload_url"]
        return url[url.index("/_blob"):]
