// Drives the real @actions/cache client against a server named by the environment
// (ACTIONS_RESULTS_URL or ACTIONS_CACHE_URL, ACTIONS_CACHE_SERVICE_V2, ACTIONS_RUNTIME_TOKEN,
// RUNNER_TEMP). HOARD_E2E_CLIENT=3 picks the 3.2.4 client (v1 only) instead of 6.3.0.
//
//   node client.mjs save    KEY PATH...
//   node client.mjs restore KEY [--restore-keys K1,K2] [--lookup-only] PATH...
//
// The client's own log goes to stdout as in a job; the last line is `RESULT <json>` so the Rust
// test can read what the call returned: the cache id for save, the matched key (or null) for restore.
const cache = process.env.HOARD_E2E_CLIENT === '3'
  ? (await import('actions-cache-3')).default
  : await import('@actions/cache');

const [command, key, ...rest] = process.argv.slice(2);
let restoreKeys = [];
let lookupOnly = false;
const paths = [];
for (let i = 0; i < rest.length; i++) {
  if (rest[i] === '--restore-keys') restoreKeys = rest[++i].split(',').filter(Boolean);
  else if (rest[i] === '--lookup-only') lookupOnly = true;
  else paths.push(rest[i]);
}

// What the process saw, for tests of the runner's preload (tests/runner.rs).
if (process.env.HOARD_E2E_SHOW_ENV) console.log(`ENV ${JSON.stringify({
  module: typeof require === 'undefined' ? 'es-module' : 'other',
  ACTIONS_RESULTS_URL: process.env.ACTIONS_RESULTS_URL,
  ACTIONS_CACHE_URL: process.env.ACTIONS_CACHE_URL,
  HOARD_ORIGINAL_ACTIONS_RESULTS_URL: process.env.HOARD_ORIGINAL_ACTIONS_RESULTS_URL,
  HOARD_ORIGINAL_ACTIONS_CACHE_URL: process.env.HOARD_ORIGINAL_ACTIONS_CACHE_URL,
})}`);

let result;
if (command === 'save') {
  result = await cache.saveCache(paths, key);
} else if (command === 'restore') {
  result = await cache.restoreCache(paths, key, restoreKeys, { lookupOnly }) ?? null;
} else {
  console.error(`unknown command ${command}`);
  process.exit(2);
}
console.log(`RESULT ${JSON.stringify(result)}`);
