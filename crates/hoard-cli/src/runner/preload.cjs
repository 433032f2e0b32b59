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
// "all". Dependency-free, and it never throws.
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
  } catch (e) {
    // Never stop an action because of hoard.
  }
})();
