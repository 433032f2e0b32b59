#!/usr/bin/env bash
# hoard runner job-started hook @VERSION@.
# Written by `hoard runner setup`, which rewrites it; `hoard runner doctor` checks that it is
# unchanged. The runner runs it before each job's steps (ACTIONS_RUNNER_HOOK_JOB_STARTED).
#
# It asks hoard's /readyz (2 s at most). If hoard does not answer ready, it leaves a marker in
# the job's RUNNER_TEMP so that the preload keeps GitHub's URLs for this job, and says why with a
# ::warning::. A job never fails because of hoard: this part always succeeds. A hook that was
# configured before hoard's (HOARD_CHAINED_JOB_STARTED_HOOK) runs afterwards, and its exit status
# is the hook's.
set +e

hoard_check() {
  local url="${HOARD_RESULTS_URL:-$HOARD_CACHE_URL}"
  [ -n "$url" ] || return 0
  local marker="${RUNNER_TEMP:-}/.hoard-fallback"
  if [ -z "${RUNNER_TEMP:-}" ]; then
    echo "::warning::hoard: RUNNER_TEMP is not set, so this job cannot be told to use GitHub's cache if hoard at $url is down"
    marker=""
  fi
  local here node answer
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  # The runner's own Node (the newest bundled one: node20 sorts after node16), else one on PATH.
  node=""
  for candidate in "$here"/../externals/node*/bin/node; do
    [ -x "$candidate" ] && node="$candidate"
  done
  [ -n "$node" ] || node="$(command -v node)"
  if [ -z "$node" ]; then
    answer="no Node.js to ask it with (none in externals/ or on PATH)"
  else
    answer="$(NODE_OPTIONS= "$node" - "$url" "${HOARD_RESULTS_URL:+results}" 2>&1 <<'JS'
'use strict';
const [base, wantResults] = process.argv.slice(2);
const say = (line) => { process.stdout.write(line + '\n'); process.exit(0); };
setTimeout(() => say('no answer within 2 s'), 2000).unref();
let url;
try { url = new URL('/readyz', base); } catch (e) { say('not a URL: ' + e.message); }
const http = require(url.protocol === 'https:' ? 'https' : 'http');
const req = http.get(url, (res) => {
  let body = '';
  res.setEncoding('utf8');
  res.on('data', (d) => { body += d; });
  res.on('end', () => {
    let json = {};
    try { json = JSON.parse(body); } catch (e) { /* said below */ }
    if (res.statusCode !== 200 || json.status !== 'ready') {
      say('answered ' + res.statusCode + (json.status ? ' (' + json.status + (json.error ? ': ' + json.error : '') + ')' : ''));
    }
    if (wantResults && !(json.forwarding && json.forwarding.results)) say('forwarding off');
    say('ready');
  });
});
req.on('error', (e) => say('unreachable: ' + (e.code || e.message)));
JS
)"
  fi
  case "$answer" in
    ready) [ -n "$marker" ] && rm -f "$marker" ;;
    "forwarding off")
      [ -n "$marker" ] && echo results > "$marker"
      echo "::warning::hoard at $url does not forward the results service (start it with --upstream-results-url), so this job's actions/cache v2 and artifact calls use GitHub's service"
      ;;
    *)
      [ -n "$marker" ] && echo all > "$marker"
      echo "::warning::hoard at $url is not ready ($answer), so this job uses GitHub's cache service"
      ;;
  esac
  return 0
}
hoard_check

if [ -n "${HOARD_CHAINED_JOB_STARTED_HOOK:-}" ]; then
  case "$HOARD_CHAINED_JOB_STARTED_HOOK" in
    *.ps1) exec pwsh -command ". '$HOARD_CHAINED_JOB_STARTED_HOOK'" ;;
    *) exec bash -e "$HOARD_CHAINED_JOB_STARTED_HOOK" ;;
  esac
fi
exit 0
