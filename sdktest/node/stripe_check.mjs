// stripe_check.mjs checks idemhttp's responses with Stripe's own Node SDK
// (the `stripe` npm package, unmodified), talking HTTP to a server that
// sdktest's Go tests start (node_test.go): a fake POST /v1/customers that
// creates a new customer on every call, behind idemhttp.
//
//   node stripe_check.mjs STRIPE_FORMAT_URL PROBLEM_FORMAT_URL
//
// STRIPE_FORMAT_URL serves idemhttp with ErrorFormat: FormatStripe,
// PROBLEM_FORMAT_URL the same with the default FormatProblem. Both serve
// /_sdktest/stats (requests received, customers created),
// /_sdktest/wait-entered and /_sdktest/release (hold a request in the
// handler), which this script calls with fetch, not with the SDK.
//
// It prints a JSON summary on stdout and exits 1 if any check fails.
import { readFileSync } from 'node:fs';
import Stripe from 'stripe';

const RETRIES = 2; // maxNetworkRetries: a retried request is sent 1+RETRIES times
const HOLD = 'hold'; // the fake holds a request with this description
const STORE_DOWN = 'store-down-'; // the store fails Claim for keys with this prefix
const PROBLEM = 'https://idem-go.dev/problems/';

const [stripeURL, problemURL] = process.argv.slice(2);
if (!stripeURL || !problemURL) {
  console.error('usage: node stripe_check.mjs STRIPE_FORMAT_URL PROBLEM_FORMAT_URL');
  process.exit(2);
}

const sdkVersion = JSON.parse(
  readFileSync(new URL('./node_modules/stripe/package.json', import.meta.url), 'utf8'),
).version;

function client(base) {
  const u = new URL(base);
  return new Stripe('sk_test_sdktest_node', {
    host: u.hostname,
    port: u.port,
    protocol: u.protocol.replace(/:$/, ''),
    maxNetworkRetries: RETRIES,
    timeout: 60_000,
    telemetry: false,
  });
}

async function stats(base) {
  const r = await fetch(new URL('/_sdktest/stats', base));
  if (!r.ok) throw new Error(`stats: HTTP ${r.status}`);
  return r.json();
}

async function control(base, what) {
  const r = await fetch(new URL(`/_sdktest/${what}`, base), { method: 'POST' });
  if (!r.ok) throw new Error(`${what}: HTTP ${r.status} ${await r.text()}`);
}

// create runs one customers.create through the SDK and reports what it
// resolved or rejected with, and how many requests it sent.
async function create(sdk, base, params, key) {
  const before = await stats(base);
  const out = {};
  try {
    const v = await sdk.customers.create(params, { idempotencyKey: key });
    out.resolved = v;
    out.last = v.lastResponse;
  } catch (err) {
    out.rejected = err;
  }
  const after = await stats(base);
  out.attempts = after.attempts - before.attempts;
  out.executions = after.executions - before.executions;
  return out;
}

// describe keeps what is worth printing of a create's outcome.
function describe(o) {
  const d = { attempts: o.attempts, executions: o.executions };
  if (o.rejected) {
    const e = o.rejected;
    d.rejected = {
      class: e.constructor?.name, type: e.type, rawType: e.rawType, code: e.code,
      statusCode: e.statusCode, doc_url: e.doc_url, message: e.message,
      shouldRetry: e.headers?.['stripe-should-retry'],
    };
  } else {
    d.resolved = {
      id: o.resolved?.id, type: o.resolved?.type, status: o.resolved?.status,
      statusCode: o.last?.statusCode, requestId: o.last?.requestId,
      idempotencyKey: o.last?.idempotencyKey, replayed: o.last?.headers?.['idempotent-replayed'],
    };
  }
  return d;
}

const checks = [];
function check(name, observed, conditions) {
  const failed = Object.entries(conditions).filter(([, ok]) => !ok).map(([label]) => label);
  checks.push({ name, ok: failed.length === 0, failed, observed });
}

// run guards one check, so that an exception fails it instead of the run.
async function run(name, fn) {
  try {
    await fn();
  } catch (err) {
    checks.push({ name, ok: false, failed: [`threw: ${err?.stack ?? err}`], observed: null });
  }
}

const stripeSDK = client(stripeURL);
const problemSDK = client(problemURL);

// --- ErrorFormat: FormatStripe ----------------------------------------

await run('stripe/replay', async () => {
  const params = { email: 'jenny@example.com', description: 'first' };
  const a = await create(stripeSDK, stripeURL, params, 'node-order-1');
  const b = await create(stripeSDK, stripeURL, params, 'node-order-1');
  const c = await create(stripeSDK, stripeURL, params, 'node-order-2');
  check('stripe/replay', { first: describe(a), replay: describe(b), otherKey: describe(c) }, {
    'first create resolves with an id': !!a.resolved?.id,
    'first create ran once': a.executions === 1,
    'first response is not marked replayed': a.last?.headers?.['idempotent-replayed'] === undefined,
    'replay resolves with the same id': !!b.resolved && b.resolved.id === a.resolved?.id,
    'replay did not run the handler': b.executions === 0,
    'replay lastResponse.requestId equals the original': !!a.last?.requestId && b.last?.requestId === a.last.requestId,
    'replay lastResponse.idempotencyKey is the key': b.last?.idempotencyKey === 'node-order-1',
    'replay carries Idempotent-Replayed: true': b.last?.headers?.['idempotent-replayed'] === 'true',
    'another key creates another customer': !!c.resolved?.id && c.resolved.id !== a.resolved?.id && c.executions === 1,
  });
});

await run('stripe/key_reused', async () => {
  await create(stripeSDK, stripeURL, { email: 'a@example.com' }, 'node-reuse-1');
  const o = await create(stripeSDK, stripeURL, { email: 'b@example.com' }, 'node-reuse-1');
  const e = o.rejected;
  check('stripe/key_reused', describe(o), {
    'rejects': !!e,
    'with StripeIdempotencyError': e instanceof Stripe.errors.StripeIdempotencyError && e.type === 'StripeIdempotencyError',
    "rawType is 'idempotency_error'": e?.rawType === 'idempotency_error',
    'code is idempotency_key_reused': e?.code === 'idempotency_key_reused',
    'statusCode is 400': e?.statusCode === 400,
    'exactly one request (no retry)': o.attempts === 1,
    'nothing ran': o.executions === 0,
  });
});

await run('stripe/key_in_use', async () => {
  const params = { email: 'a@example.com', description: HOLD };
  const first = stripeSDK.customers.create(params, { idempotencyKey: 'node-busy-1' });
  await control(stripeURL, 'wait-entered');
  const o = await create(stripeSDK, stripeURL, params, 'node-busy-1');
  await control(stripeURL, 'release');
  const f = await first;
  const again = await create(stripeSDK, stripeURL, params, 'node-busy-1');
  const e = o.rejected;
  check('stripe/key_in_use', { second: describe(o), first: { id: f.id }, afterwards: describe(again) }, {
    'rejects': !!e,
    // stripe-node maps only 400 and 404 idempotency_error to
    // StripeIdempotencyError; a 409 is a StripeAPIError, with rawType
    // idempotency_error — as for Stripe's own 409.
    'with StripeAPIError': e instanceof Stripe.errors.StripeAPIError && e.type === 'StripeAPIError',
    "rawType is 'idempotency_error'": e?.rawType === 'idempotency_error',
    'code is idempotency_key_in_use': e?.code === 'idempotency_key_in_use',
    'statusCode is 409': e?.statusCode === 409,
    // Stripe-Should-Retry: true, which stripe-node honours.
    [`retried: 1+${RETRIES} requests`]: o.attempts === 1 + RETRIES,
    'nothing ran for the second': o.executions === 0,
    'afterwards the key replays the first': again.resolved?.id === f.id && again.executions === 0,
  });
});

await run('stripe/key_invalid', async () => {
  const o = await create(stripeSDK, stripeURL, { email: 'a@example.com' }, 'not a token');
  const e = o.rejected;
  check('stripe/key_invalid', describe(o), {
    'rejects with StripeInvalidRequestError': e instanceof Stripe.errors.StripeInvalidRequestError,
    "rawType is 'invalid_request_error'": e?.rawType === 'invalid_request_error',
    'code is idempotency_key_invalid': e?.code === 'idempotency_key_invalid',
    'statusCode is 400': e?.statusCode === 400,
    'exactly one request': o.attempts === 1,
  });
});

await run('stripe/store_unavailable', async () => {
  const o = await create(stripeSDK, stripeURL, { email: 'a@example.com' }, `${STORE_DOWN}node-1`);
  const e = o.rejected;
  check('stripe/store_unavailable', describe(o), {
    'rejects with StripeAPIError': e instanceof Stripe.errors.StripeAPIError && e.type === 'StripeAPIError',
    "rawType is 'api_error'": e?.rawType === 'api_error',
    'code is idempotency_store_unavailable': e?.code === 'idempotency_store_unavailable',
    'statusCode is 503': e?.statusCode === 503,
    [`retried: 1+${RETRIES} requests`]: o.attempts === 1 + RETRIES,
    'nothing ran': o.executions === 0,
  });
});

// --- ErrorFormat: FormatProblem (the default): the reported bug ---------
// stripe-node turns a response into an error only when its JSON has an
// `error` member. A problem+json body has none, so every idemhttp error
// *resolves* as if it were the created object. These checks record that.

await run('problem/key_reused', async () => {
  await create(problemSDK, problemURL, { email: 'a@example.com' }, 'node-reuse-1');
  const o = await create(problemSDK, problemURL, { email: 'b@example.com' }, 'node-reuse-1');
  check('problem/key_reused', describe(o), {
    'resolves (no rejection): the SDK reads the 422 as a success': !!o.resolved && !o.rejected,
    'the "customer" has no id': o.resolved?.id === undefined,
    'it is the problem document': o.resolved?.type === `${PROBLEM}key-reused` && o.resolved?.status === 422,
    'lastResponse.statusCode is 422': o.last?.statusCode === 422,
    'one request (a 422 without Stripe-Should-Retry is not retried)': o.attempts === 1,
  });
});

await run('problem/key_in_use', async () => {
  const params = { email: 'a@example.com', description: HOLD };
  const first = problemSDK.customers.create(params, { idempotencyKey: 'node-busy-1' });
  await control(problemURL, 'wait-entered');
  const o = await create(problemSDK, problemURL, params, 'node-busy-1');
  await control(problemURL, 'release');
  const f = await first;
  check('problem/key_in_use', { second: describe(o), first: { id: f.id } }, {
    'resolves (no rejection)': !!o.resolved && !o.rejected,
    'the "customer" has no id': o.resolved?.id === undefined,
    'it is the problem document': o.resolved?.type === `${PROBLEM}key-in-flight`,
    'lastResponse.statusCode is 409': o.last?.statusCode === 409,
    [`retried (409): 1+${RETRIES} requests`]: o.attempts === 1 + RETRIES,
  });
});

await run('problem/store_unavailable', async () => {
  const o = await create(problemSDK, problemURL, { email: 'a@example.com' }, `${STORE_DOWN}node-1`);
  check('problem/store_unavailable', describe(o), {
    'resolves (no rejection)': !!o.resolved && !o.rejected,
    'the "customer" has no id': o.resolved?.id === undefined,
    'it is the problem document': o.resolved?.type === `${PROBLEM}store-unavailable`,
    'lastResponse.statusCode is 503': o.last?.statusCode === 503,
    [`retried (5xx): 1+${RETRIES} requests`]: o.attempts === 1 + RETRIES,
  });
});

const ok = checks.every((c) => c.ok);
console.log(JSON.stringify({
  sdk: 'stripe-node', version: sdkVersion, node: process.version, maxNetworkRetries: RETRIES, ok, checks,
}, null, 2));
// Keep-alive sockets must not hold the process open.
process.exit(ok ? 0 : 1);
