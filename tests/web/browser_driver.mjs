// The browser of the page's test (browser_test.cc): headless Debian
// chromium, driven through playwright-core (web/node_modules), taking one
// JSON command per line on stdin and answering one JSON line per command on
// stdout. Every request to an origin other than the one of `allow` is
// aborted and recorded, as are console errors, page errors and failed
// requests.
//
//   node browser_driver.mjs --web-dir=DIR --chromium=PATH --allow=http://127.0.0.1:PORT
//
// Commands ({"cmd": ..., ...}; answers {"ok": true, ...} or {"ok": false, "error": ...}):
//   open {url}                        navigate and wait for the load event
//   reload                            load the page again
//   wait {expr, timeout_ms}           until the page expression is truthy; its value
//   eval {expr}                       the page expression's value
//   text {selector}                   textContent (trimmed) of the first match
//   fill {selector, value} / select {selector, value} / click {selector}
//   hover {selector, x, y}            the mouse at fractions x, y of the element's box
//   screenshot {path, full_page}
//   session {key, value}              sessionStorage entry set before every later page load
//   events / reset_events             console errors, page errors, blocked and failed requests
//   quit
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const args = Object.fromEntries(process.argv.slice(2).map((a) => {
  const m = /^--([^=]+)=(.*)$/.exec(a);
  if (!m) throw new Error(`bad argument ${a}`);
  return [m[1], m[2]];
}));
const require = createRequire(join(args['web-dir'], 'package.json'));
const { chromium } = require('playwright-core');
const allowed = new URL(args.allow).origin;

const profile = mkdtempSync(join(tmpdir(), 'gac-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: args.chromium,
  headless: true,
  viewport: { width: 1400, height: 900 },
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
         '--disable-component-update', '--disable-sync', '--no-first-run'],
});
const events = { console_errors: [], page_errors: [], blocked: [], failed: [] };
await context.route('**/*', (route) => {
  const url = route.request().url();
  if (new URL(url).origin === allowed) return route.continue();
  events.blocked.push(url);
  return route.abort('blockedbyclient');
});
const page = context.pages()[0] || await context.newPage();
page.on('console', (msg) => {
  if (msg.type() === 'error') events.console_errors.push({ text: msg.text(), url: msg.location().url || '' });
});
page.on('pageerror', (err) => events.page_errors.push(String(err && err.stack || err)));
page.on('requestfailed', (req) => events.failed.push({ url: req.url(), error: req.failure() ? req.failure().errorText : '' }));

async function run(c) {
  switch (c.cmd) {
    case 'open': {
      const started = Date.now();
      await page.goto(c.url, { waitUntil: 'load' });
      return { ms: Date.now() - started };
    }
    case 'reload': {
      const started = Date.now();
      await page.reload({ waitUntil: 'load' });
      return { ms: Date.now() - started };
    }
    case 'wait': {
      // Polled with evaluate: the page's Content-Security-Policy forbids the
      // eval that waitForFunction's string predicates use.
      const deadline = Date.now() + (c.timeout_ms || 10000);
      let value;
      for (;;) {
        value = await page.evaluate(c.expr);
        if (value) return { value };
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${c.expr} (last value ${JSON.stringify(value)})`);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
    case 'eval':
      return { value: await page.evaluate(c.expr) };
    case 'text':
      return { value: ((await page.locator(c.selector).first().textContent()) || '').trim() };
    case 'fill':
      await page.locator(c.selector).first().fill(c.value);
      return {};
    case 'select':
      await page.locator(c.selector).first().selectOption(c.value);
      return {};
    case 'click':
      await page.locator(c.selector).first().click();
      return {};
    case 'hover': {
      const box = await page.locator(c.selector).first().boundingBox();
      await page.mouse.move(box.x + c.x * box.width, box.y + c.y * box.height);
      return {};
    }
    case 'screenshot':
      await page.screenshot({ path: c.path, fullPage: Boolean(c.full_page) });
      return {};
    case 'session':
      await context.addInitScript(([key, value]) => sessionStorage.setItem(key, value), [c.key, c.value]);
      return {};
    case 'events':
      return { events };
    case 'reset_events':
      for (const list of Object.values(events)) list.length = 0;
      return {};
    default:
      throw new Error(`unknown command ${c.cmd}`);
  }
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let c;
  try {
    c = JSON.parse(line);
  } catch (e) {
    process.stdout.write(JSON.stringify({ ok: false, error: `not JSON: ${e.message}` }) + '\n');
    continue;
  }
  if (c.cmd === 'quit') break;
  try {
    process.stdout.write(JSON.stringify(Object.assign({ ok: true }, await run(c))) + '\n');
  } catch (e) {
    process.stdout.write(JSON.stringify({ ok: false, error: String(e && e.message || e) }) + '\n');
  }
}
await context.close();
rmSync(profile, { recursive: true, force: true });
process.stdout.write(JSON.stringify({ ok: true, bye: true }) + '\n');
