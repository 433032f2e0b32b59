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
  const body = (await r.text()).slice(0, 2000);
  process.stdout.write(JSON.stringify({ status: r.status, body }));
}, (e) => process.stdout.write(JSON.stringify({ error: String((e && (e.cause || e).code) || (e && e.message) || e) })));
`;
  const tools = env.HOARD_BUILD_TOOLS.split(',').map((t) => t.trim()).filter(Boolean);
  if (!tools.length || !env.ACTIONS_RUNTIME_TOKEN || !env.GITHUB_ENV || !env.RUNNER_TEMP) return;
  const fs = require('fs');
  try {
    // Once per job: the first action that gets here makes the exchange, and no other tries.
    fs.closeSync(fs.openSync(require('path').join(env.RUNNER_TEMP, '.hoard-tools'), 'wx'));
  } catch (e) {
    return;
  }
  const origin = new URL(hoardUrl).origin;
  const child = require('child_process').spawnSync(process.execPath, ['-e', EXCHANGE], {
    // Not this process's environment: NODE_OPTIONS would load this preload again.
    env: {
      PATH: env.PATH || '',
      HOARD_EXCHANGE_URL: origin + '/_hoard/tools/token',
      HOARD_EXCHANGE_TOKEN: env.ACTIONS_RUNTIME_TOKEN,
    },
    encoding: 'utf8',
    timeout: 5000,
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  let answer = {};
  try { answer = JSON.parse(child.stdout || '{}') || {}; } catch (e) { /* said below */ }
  let token = '';
  try { token = answer.status === 200 ? JSON.parse(answer.body).token || '' : ''; } catch (e) { /* said below */ }
  if (!/^hoardtool\.[A-Za-z0-9_.-]+$/.test(token)) {
    const why = answer.status ? 'hoard answered ' + answer.status + ' ' + String(answer.body || '').slice(0, 200)
      : answer.error ? 'hoard is unreachable: ' + answer.error : 'hoard did not answer within 5 s';
    process.stdout.write('::warning::' + escapeCommand('hoard: no token for the build tools of this job (' + why + '); they build without hoard\'s cache') + '\n');
    return;
  }
  process.stdout.write('::add-mask::' + token + '\n');
  const vars = [['HOARD_URL', origin], ['HOARD_TOOL_TOKEN', token]];
  const url = new URL(origin);
  if (tools.includes('turbo')) {
    vars.push(['TURBO_API', origin], ['TURBO_TOKEN', token], ['TURBO_TEAM', env.GITHUB_REPOSITORY_OWNER || 'hoard']);
  }
  if (tools.includes('nx')) {
    vars.push(['NX_SELF_HOSTED_REMOTE_CACHE_SERVER', origin], ['NX_SELF_HOSTED_REMOTE_CACHE_ACCESS_TOKEN', token]);
  }
  if (tools.includes('sccache')) {
    vars.push(['SCCACHE_WEBDAV_ENDPOINT', origin + '/_dav/sccache'], ['SCCACHE_WEBDAV_TOKEN', token]);
  }
  if (tools.includes('ccache')) {
    // ccache sends a URL's credentials as Basic; hoard takes the token as the password.
    vars.push(['CCACHE_REMOTE_STORAGE', url.protocol + '//job:' + token + '@' + url.host + '/_dav/ccache|layout=subdirs']);
  }
  if (tools.includes('go') && env.HOARD_GOCACHEPROG) {
    vars.push(['GOCACHEPROG', env.HOARD_GOCACHEPROG]);
  }
  // The workflow's own settings win.
  const lines = vars.filter(([name]) => !env[name]).map(([name, value]) => name + '=' + value + '\n');
  fs.appendFileSync(env.GITHUB_ENV, lines.join(''));
}
