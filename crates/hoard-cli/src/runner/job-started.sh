#!/usr/bin/env bash
# hoard runner job-started hook @VERSION@.
# Written by `hoard runner setup`, which rewrites it; `hoard runner doctor` checks that it is
# unchanged. The runner runs it before each job's steps (ACTIONS_RUNNER_HOOK_JOB_STARTED).
#
# It asks hoard's /readyz (2 s at most) at each URL it sets: HOARD_RESULTS_URL (which must also
# forward the results service) and HOARD_CACHE_URL, if on another origin. For what does not
# answer ready, it leaves a marker in the job's RUNNER_TEMP ("results", "cache" or "all") so that
# the preload keeps GitHub's URLs there for this job, and says why with a ::warning::. Text from
# hoard is escaped as workflow commands require, so it cannot start a command of its own. A job
# never fails because of hoard: this part always succeeds. A hook that was configured before
# hoard's (HOARD_CHAINED_JOB_STARTED_HOOK) runs afterwards, and its exit status is the hook's.
set +e

hoard_check() {
  [ -n "${HOARD_RESULTS_URL:-}${HOARD_CACHE_URL:-}" ] || return 0
  local marker="${RUNNER_TEMP:-}/.hoard-fallback"
  if [ -z "${RUNNER_TEMP:-}" ]; then
    echo "::warning::hoard: RUNNER_TEMP is not set, so this job cannot be told to use GitHub's cache if hoard is down"
    marker=""
  fi
  local here node answer verdict warnings
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  # The runner's own Node (the newest bundled one: node20 sorts after node16), else one on PATH.
  node=""
  for candidate in "$here"/../externals/node*/bin/node; do
    [ -x "$candidate" ] && node="$candidate"
  done
  [ -n "$node" ] || node="$(command -v node)"
  if [ -z "$node" ]; then
    answer=$'all\n::warning::hoard: no Node.js to ask it with (none in externals/ or on PATH), so this job uses GitHub\'s cache service'
  else
    # Its first line: what to fall back for (none, results, cache or all); then the warnings,
    # escaped.
    answer="$(NODE_OPTIONS= "$node" - 2>/dev/null <<'JS'
'use strict';
const env = process.env;
const results = env.HOARD_RESULTS_URL || '';
const cache = env.HOARD_CACHE_URL || '';
// Workflow-command escaping (%, CR, LF), and no other control character either.
const esc = (s) => String(s)
  .replace(/%/g, '%25').replace(/\r/g, '%0D').replace(/\n/g, '%0A')
  .replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
// A URL as shown: without a user name or password.
const shown = (u) => {
  try { const x = new URL(u); x.username = ''; x.password = ''; return x.href; } catch (e) { return u; }
};
const origin = (u) => { try { return new URL(u).origin; } catch (e) { return null; } };
// Why `base` cannot be used, or null.
const probe = (base, wantForwarding) => new Promise((resolve) => {
  let url;
  try { url = new URL('/readyz', base); } catch (e) { resolve('not a URL'); return; }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') { resolve('not an http:// or https:// URL'); return; }
  let req = null;
  const timer = setTimeout(() => { done('no answer within 2 s'); if (req) req.destroy(); }, 2000);
  function done(why) { clearTimeout(timer); resolve(why); }
  try {
    req = require(url.protocol === 'https:' ? 'https' : 'http').get(url, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { if (body.length < 65536) body += d; });
      res.on('error', (e) => done('unreachable: ' + (e.code || e.message)));
      res.on('end', () => {
        let json = {};
        try { json = JSON.parse(body) || {}; } catch (e) { /* said below */ }
        if (res.statusCode !== 200 || json.status !== 'ready') {
          done('answered ' + res.statusCode + (json.status ? ' (' + json.status + (json.error ? ': ' + json.error : '') + ')' : ''));
        } else if (wantForwarding && !(json.forwarding && json.forwarding.results)) {
          done('forwarding off');
        } else {
          done(null);
        }
      });
    });
    req.on('error', (e) => done('unreachable: ' + (e.code || e.message)));
  } catch (e) {
    done('unreachable: ' + e.message);
  }
});
(async () => {
  // On the results URL's origin, one answer covers both.
  const shared = results && cache && origin(results) !== null && origin(results) === origin(cache);
  const [r, c] = await Promise.all([
    results ? probe(results, true) : null,
    cache && !shared ? probe(cache, false) : null,
  ]);
  const resultsOff = Boolean(results && r);
  const cacheOff = Boolean(cache && (shared ? r && r !== 'forwarding off' : c));
  const all = (resultsOff || !results) && (cacheOff || !cache);
  const verdict = !resultsOff && !cacheOff ? 'none' : all ? 'all' : resultsOff ? 'results' : 'cache';
  const lines = [];
  if (r === 'forwarding off') {
    lines.push('hoard at ' + shown(results) + ' does not forward the results service (start it with --upstream-results-url), so this job\'s actions/cache v2 and artifact calls use GitHub\'s service');
  } else if (resultsOff) {
    lines.push('hoard at ' + shown(results) + ' is not ready (' + r + '), so this job' + (all ? ' uses GitHub\'s cache service' : '\'s actions/cache v2 and artifact calls use GitHub\'s service'));
  }
  if (cacheOff && !shared) {
    lines.push((results ? 'hoard\'s v1 cache URL ' : 'hoard at ') + shown(cache) + ' (HOARD_CACHE_URL) is not ready (' + c + '), so this job\'s v1 cache clients (ACTIONS_CACHE_URL) use GitHub\'s cache service');
  }
  process.stdout.write([verdict].concat(lines.map((l) => '::warning::' + esc(l))).join('\n') + '\n');
  process.exit(0);
})();
JS
)"
  fi
  verdict="${answer%%$'\n'*}"
  warnings=""
  [ "$answer" = "$verdict" ] || warnings="${answer#*$'\n'}"
  case "$verdict" in
    none|results|cache|all) ;;
    *)
      verdict=all
      warnings="::warning::hoard: its URLs could not be checked, so this job uses GitHub's cache service"
      ;;
  esac
  if [ "$verdict" = none ]; then
    [ -n "$marker" ] && rm -f "$marker"
  else
    [ -n "$marker" ] && echo "$verdict" > "$marker"
  fi
  [ -n "$warnings" ] && printf '%s\n' "$warnings"
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
