// hoard runner preload @VERSION@.
// Written by `hoard runner setup`, which rewrites it; `hoard runner doctor` checks that it is
// unchanged. Loaded into every Node process of this runner through
// NODE_OPTIONS=--require (CommonJS and ES-module entry points alike), before the action's code.
//
// Only where the runner set ACTIONS_RESULTS_URL (or ACTIONS_CACHE_URL), that is in JavaScript
// actions, it puts hoard's URL there (HOARD_RESULTS_URL, HOARD_CACHE_URL) and keeps GitHub's in
// HOARD_ORIGINAL_ACTIONS_RESULTS_URL (HOARD_ORIGINAL_ACTIONS_CACHE_URL). Every other process is
// left alone. If the job-started hook found hoard not ready, it left a marker in RUNNER_TEMP and
// this job keeps GitHub's URLs. Dependency-free, and it never throws.
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
    if (fallback && fallback !== 'results') return;
    const swap = (name, hoard) => {
      const current = env[name];
      if (!current || !hoard || current === hoard) return;
      env['HOARD_ORIGINAL_' + name] = current;
      env[name] = hoard;
    };
    // "results": hoard does not forward to the results service, so artifacts and cache v2
    // stay with GitHub for this job; v1 (ACTIONS_CACHE_URL) never carries artifacts.
    if (fallback !== 'results') swap('ACTIONS_RESULTS_URL', env.HOARD_RESULTS_URL);
    swap('ACTIONS_CACHE_URL', env.HOARD_CACHE_URL);
  } catch (e) {
    // Never stop an action because of hoard.
  }
})();
