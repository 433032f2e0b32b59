// hoard runner preload @VERSION@.
// Written by `hoard runner setup`, which rewrites it; `hoard runner doctor` checks that it is
// unchanged. Loaded into every Node process of this runner through
// NODE_OPTIONS=--require (CommonJS and ES-module entry points alike), before the action's code.
//
// Only where the runner set ACTIONS_RESULTS_URL (or ACTIONS_CACHE_URL), that is in JavaScript
// actions, it puts hoard's URL there (HOARD_RESULTS_URL, HOARD_CACHE_URL) and keeps GitHub's in
// HOARD_ORIGINAL_ACTIONS_RESULTS_URL (HOARD_ORIGINAL_ACTIONS_CACHE_URL). The names some actions
// and forked runners read first, CUSTOM_ACTIONS_RESULTS_URL and CUSTOM_ACTIONS_CACHE_URL, get the
// same URL as their ACTIONS_ twin, so such actions agree with hoard and fall back with it.
// ACTIONS_CACHE_MODE and every other variable are left alone, as is every process that is not
// an action. If the job-started hook found hoard (or one of its URLs) not ready, it left a
// marker in RUNNER_TEMP naming what this job keeps GitHub's URL for: "results", "cache" or
// "all".
//
// With HOARD_BUILD_TOOLS (`hoard runner setup --build-tools`), the first action of a job whose
// hoard is ready also exchanges the job's runtime token for a tool token (POST
// /_hoard/tools/token: it can do no more than the job, and only at hoard), masks it, and appends
// to GITHUB_ENV, for the job's later steps, the variables the named tools read (HOARD_URL,
// HOARD_TOOL_TOKEN, TURBO_*, NX_SELF_HOSTED_*, SCCACHE_WEBDAV_*, CCACHE_REMOTE_STORAGE,
// GOCACHEPROG), except those the workflow sets itself. A marker in RUNNER_TEMP makes it once per
// job. Dependency-free, and it never throws.
'use strict';
(function hoardPreload() {
  try {
    const env = process.env;
    if (!env.ACTIONS_RESULTS_URL && !env.ACTIONS_CACHE_URL) return;
    let fallback = '';
    if (env.RUNNER_TEMP) {
      try {
        const marker = require('path').join(env.RUNNER_TEMP, '.hoard-fallback');
        fallback = require('fs').readFileSync(marker, 'utf8').trim() || 'all';
      } catch (e) {
        // No marker: hoard answered ready when the job started.
      }
    }
    const route = (name, hoard, toGitHub) => {
      const custom = 'CUSTOM_' + name;
      if (toGitHub) {
        // The job keeps GitHub's URL: a CUSTOM_ twin set to hoard's (by .env) follows it.
        if (hoard && env[custom] === hoard) {
          if (env[name]) env[custom] = env[name];
          else delete env[custom];
        }
        return;
      }
      if (!hoard) return;
      for (const n of [name, custom]) {
        const current = env[n];
        if (!current || current === hoard) continue;
        env['HOARD_ORIGINAL_' + n] = current;
        env[n] = hoard;
      }
    };
    // "results": hoard does not forward to the results service, so artifacts and cache v2
    // stay with GitHub for this job; v1 (ACTIONS_CACHE_URL) never carries artifacts.
    // "cache": hoard's v1 URL (--cache-url) did not answer, so v1 clients stay with GitHub.
    const all = fallback !== '' && fallback !== 'results' && fallback !== 'cache';
    route('ACTIONS_RESULTS_URL', env.HOARD_RESULTS_URL, all || fallback === 'results');
    route('ACTIONS_CACHE_URL', env.HOARD_CACHE_URL, all || fallback === 'cache');
    if (env.HOARD_BUILD_TOOLS && !all) {
      // "results" may only say that hoard does not forward: its cache URL still answers.
      const ready = fallback === 'results' ? env.HOARD_CACHE_URL : env.HOARD_RESULTS_URL || env.HOARD_CACHE_URL;
      if (ready) buildTools(env, ready);
    }
  } catch (e) {
    // Never stop an action because of hoard.
  }
})();

// Workflow-command escaping (%, CR, LF), and no other control character either.
function escapeCommand(s) {
  return String(s)
    .replace(/%/g, '%25').replace(/\r/g, '%0D').replace(/\n/g, '%0A')
    .replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g, ' ');
}

function buildTools(env, hoardUrl) {
  // The exchange, in a Node process of its own (the preload cannot wait for a promise before the
  // action starts): at most 5 s, once per job. Its answer is one JSON line.
  const EXCHANGE = `
fetch(process.env.HOARD_EXCHANGE_URL, {
  method: 'POST',
  headers: { authorization: 'Bearer ' + process.env.HOARD_EXCHANGE_TOKEN },
  signal: AbortSignal.timeout(4000),
}).then(async (r) => {
  const body = (await r.text()).slice(0, 65536);
  process.stdout.write(JSON.stringify({ status: r.status, body }));
}, (e) => process.stdout.write(JSON.stringify({
  error: e && e.name === 'TimeoutError' ? 'no answer within 4 s' : String((e && e.cause && e.cause.code) || (e && e.message) || e),
})));
`;
  const tools = env.HOARD_BUILD_TOOLS.split(',').map((t) => t.trim()).filter(Boolean);
  if (!tools.length || !env.ACTIONS_RUNTIME_TOKEN || !env.GITHUB_ENV || !env.RUNNER_TEMP) return;
  // pull_request_target runs with the base branch's token, often on the pull request's code:
  // its run: steps get no token that writes the base branch's cache.
  if (env.GITHUB_EVENT_NAME === 'pull_request_target') return;
  const fs = require('fs');
  try {
    // Once per job: the first action that gets here makes the exchange, and no other tries.
    fs.closeSync(fs.openSync(require('path').join(env.RUNNER_TEMP, '.hoard-tools'), 'wx'));
  } catch (e) {
    return;
  }
  const origin = new URL(hoardUrl).origin;
  // Not this process's environment: NODE_OPTIONS would load this preload again.
  const childEnv = {
    PATH: env.PATH || '',
    HOARD_EXCHANGE_URL: origin + '/_hoard/tools/token',
    HOARD_EXCHANGE_TOKEN: env.ACTIONS_RUNTIME_TOKEN,
  };
  // A private CA, as the job-started hook's own Node gets it.
  for (const name of ['NODE_EXTRA_CA_CERTS', 'SSL_CERT_FILE', 'SSL_CERT_DIR']) {
    if (env[name]) childEnv[name] = env[name];
  }
  const child = require('child_process').spawnSync(process.execPath, ['-e', EXCHANGE], {
    env: childEnv,
    encoding: 'utf8',
    timeout: 5000,
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  let answer = {};
  try { answer = JSON.parse(child.stdout || '{}') || {}; } catch (e) { /* said below */ }
  let token = '';
  try { token = answer.status === 200 ? JSON.parse(answer.body).token || '' : ''; } catch (e) { /* said below */ }
  if (!/^hoardtool\.[A-Za-z0-9_.-]+$/.test(token)) {
    const why = answer.status === 200 ? 'hoard answered 200 without a token'
      : answer.status ? 'hoard answered ' + answer.status + ' ' + String(answer.body || '').slice(0, 200)
      : answer.error ? 'hoard is unreachable: ' + answer.error : 'hoard did not answer within 5 s';
    process.stdout.write('::warning::' + escapeCommand('hoard: no token for the build tools of this job (' + why + '); they build without hoard\'s cache') + '\n');
    return;
  }
  process.stdout.write('::add-mask::' + token + '\n');
  const url = new URL(origin);
  // Each tool's variables, and the ones that say the workflow points it elsewhere already
  // (Vercel's remote cache, Nx Cloud, another sccache or ccache storage): then that tool is
  // left to the workflow, all its variables, so that no token of one server goes to another.
  const each = {
    turbo: [[['TURBO_API', origin], ['TURBO_TOKEN', token], ['TURBO_TEAM', env.GITHUB_REPOSITORY_OWNER || 'hoard']],
      ['TURBO_TEAMID']],
    nx: [[['NX_SELF_HOSTED_REMOTE_CACHE_SERVER', origin], ['NX_SELF_HOSTED_REMOTE_CACHE_ACCESS_TOKEN', token]],
      ['NX_CLOUD_ACCESS_TOKEN', 'NX_CLOUD_AUTH_TOKEN']],
    sccache: [[['SCCACHE_WEBDAV_ENDPOINT', origin + '/_dav/sccache'], ['SCCACHE_WEBDAV_TOKEN', token]],
      ['SCCACHE_WEBDAV_USERNAME', 'SCCACHE_WEBDAV_PASSWORD', 'SCCACHE_WEBDAV_KEY_PREFIX', 'SCCACHE_GHA_ENABLED', 'SCCACHE_BUCKET',
        'SCCACHE_GCS_BUCKET', 'SCCACHE_AZURE_CONNECTION_STRING', 'SCCACHE_REDIS', 'SCCACHE_REDIS_ENDPOINT', 'SCCACHE_MEMCACHED',
        'SCCACHE_MEMCACHED_ENDPOINT', 'SCCACHE_CONF']],
    // ccache sends a URL's credentials as Basic; hoard takes the token as the password.
    ccache: [[['CCACHE_REMOTE_STORAGE', url.protocol + '//job:' + token + '@' + url.host + '/_dav/ccache|layout=subdirs']],
      ['CCACHE_SECONDARY_STORAGE', 'CCACHE_CONFIGPATH']],
    go: [[], []],
  };
  // Go stops if it cannot start GOCACHEPROG: only a hoard binary this job can run.
  const prog = (env.HOARD_GOCACHEPROG || '').split(' ')[0];
  if (prog && tools.includes('go')) {
    try {
      fs.accessSync(prog, fs.constants.X_OK);
      each.go[0].push(['GOCACHEPROG', env.HOARD_GOCACHEPROG]);
    } catch (e) {
      process.stdout.write('::warning::' + escapeCommand('hoard: ' + prog + ' cannot be run, so Go builds in this job do not use hoard (GOCACHEPROG is not set)') + '\n');
    }
  }
  const vars = [['HOARD_URL', origin], ['HOARD_TOOL_TOKEN', token]].filter(([name]) => !env[name]);
  for (const tool of tools) {
    const [mine, elsewhere] = each[tool] || [[], []];
    if (mine.some(([name]) => env[name]) || elsewhere.some((name) => env[name])) continue;
    vars.push(...mine);
  }
  const lines = vars.map(([name, value]) => name + '=' + value + '\n');
  fs.appendFileSync(env.GITHUB_ENV, lines.join(''));
}
