// gacd's page: the runs this gacd stores, and one run's alignment, regimes,
// norms, trainer scalars and per-layer cosines, updated live. Everything it
// shows comes from gacd's JSON API (/api/v1, docs/GACD.md); the charts are
// uPlot's (web/node_modules/uplot, compiled into gacd with this file).
//
// Views (location.hash): "#/" lists the runs; "#/run/<run id>?rank=N" shows
// one run. The browser test (tests/web) reads the values of elements with a
// data-field attribute and document.body.dataset.firstChartMs.
'use strict';
(function () {
  const REGIMES = ['safe', 'project', 'skip', 'invalid', 'spike'];
  const REGIME_COLORS = { safe: '#2da44e', project: '#d4a72c', skip: '#cf222e', invalid: '#8250df', spike: '#0969da' };
  const PAGE = 10000;              // records per request: the API's largest page
  const FIRST_BLOCK = 5000;        // the latest steps of a run, drawn before its older history
  const PARALLEL = 3;              // requests in flight while loading a run
  const POLL_MS = 1000;            // new steps of a run, while it is shown
  const HEATMAP_STEPS = 300;       // steps in the heat map when not zoomed
  const HEATMAP_MAX_STEPS = 2000;  // the largest zoomed range whose layers are loaded
  const TOKEN_KEY = 'gacd-token';

  let token = sessionStorage.getItem(TOKEN_KEY) || '';
  let generation = 0;  // +1 per navigation: loops of an older view stop
  let lastContact = 0;  // Date.now() of the last answer from gacd

  const $ = (sel, root = document) => root.querySelector(sel);
  // A value of the run view (the runs table uses the same field names).
  const field = (name) => document.querySelector(`#run-view [data-field="${name}"]`);
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // ------------------------------------------------------------ API

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // The path of a run's resource. Run ids may contain '/': gacd reads the
  // resource from the end of the path, so the summary is always asked as
  // .../summary (a run id may itself end in /steps).
  const runPath = (run) => '/api/v1/runs/' + run.split('/').map(encodeURIComponent).join('/');

  async function api(path, init = {}) {
    const headers = Object.assign({ Accept: 'application/json' }, init.headers);
    if (token) headers.Authorization = 'Bearer ' + token;
    let resp;
    try {
      resp = await fetch(path, Object.assign({}, init, { headers, cache: 'no-store' }));
    } catch (e) {
      throw new ApiError(0, 'UNAVAILABLE', 'gacd does not answer (' + e.message + ')');
    }
    const text = await resp.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch (e) {
      body = null;
    }
    lastContact = Date.now();
    if (!resp.ok) {
      const code = body && body.code ? body.code : 'HTTP_' + resp.status;
      throw new ApiError(resp.status, code, body && body.message ? body.message : text || resp.statusText);
    }
    return body;
  }

  // Runs `fn` over `items` with at most `limit` calls in flight; results in order.
  async function mapLimit(items, limit, fn) {
    const out = new Array(items.length);
    let next = 0;
    const worker = async () => {
      while (next < items.length) {
        const i = next++;
        out[i] = await fn(items[i], i);
      }
    };
    await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
    return out;
  }

  // ------------------------------------------------------------ formatting

  const dash = '–';
  const fmtFixed = (x, digits) => (x === null || x === undefined || !Number.isFinite(x) ? dash : x.toFixed(digits));
  const fmtNum = (x) => (x === null || x === undefined || !Number.isFinite(x) ? dash : Number(x.toPrecision(4)).toString());
  const fmtInt = (x) => (x === null || x === undefined ? dash : Number(x).toLocaleString('en-US'));
  function fmtAge(seconds) {
    if (!Number.isFinite(seconds)) return dash;
    const s = Math.max(0, seconds);
    if (s < 60) return Math.floor(s) + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    if (s < 86400) return (s / 3600).toFixed(1) + ' h ago';
    return (s / 86400).toFixed(1) + ' d ago';
  }
  function fmtThresholds(t) {
    return t ? `${fmtNum(t.c_low)} / ${fmtNum(t.c_high)}` : dash;
  }
  // The settings a step was decided with: gacd's `config` with the rule the
  // agent reported in `step` (c_low, c_high, trigger, window and the window
  // thresholds; null when gacd decided) put over it, as gacd's metrics do
  // (proto::DecidedWith).
  function decidedWith(config, step) {
    if (!config || !step || step.c_low === null || step.c_low === undefined) return config;
    const out = Object.assign({}, config, { thresholds: Object.assign({}, config.thresholds, { c_low: step.c_low, c_high: step.c_high }) });
    if (step.trigger) out.trigger = step.trigger;
    if (step.window) out.window = step.window;
    if (step.window_c_low !== null && step.window_c_low !== undefined) {
      out.window_thresholds = Object.assign({}, config.window_thresholds || config.thresholds,
        { c_low: step.window_c_low, c_high: step.window_c_high });
    }
    out.decided_in_trainer = true;
    return out;
  }

  // ------------------------------------------------------------ chrome

  function setBanner(text, isError) {
    const b = $('#banner');
    b.hidden = !text;
    b.textContent = text || '';
    b.classList.toggle('error', Boolean(isError));
  }

  function showApiError(e, what) {
    if (e.status === 401) {
      setBanner(`${what}: gacd asks for a token (${e.message}). Enter one with the "token" button.`, true);
      $('#token-panel').hidden = false;
    } else {
      setBanner(`${what}: ${e.message}${e.code ? ' (' + e.code + ')' : ''}`, true);
    }
  }

  function tickStatus() {
    const s = $('#status');
    const age = (Date.now() - lastContact) / 1000;
    s.textContent = lastContact ? 'updated ' + fmtAge(age) : '';
    s.classList.toggle('live', lastContact > 0 && age < 5);
  }

  function show(id) {
    for (const v of ['runs-view', 'run-view']) $('#' + v).hidden = v !== id;
  }

  function setupToken() {
    const panel = $('#token-panel');
    const input = $('#token-input');
    $('#token-button').addEventListener('click', () => {
      panel.hidden = !panel.hidden;
      if (!panel.hidden) input.focus();
    });
    panel.addEventListener('submit', (ev) => {
      ev.preventDefault();
      token = input.value.trim();
      sessionStorage.setItem(TOKEN_KEY, token);
      input.value = '';
      panel.hidden = true;
      route();
    });
    $('#token-forget').addEventListener('click', () => {
      token = '';
      sessionStorage.removeItem(TOKEN_KEY);
      input.value = '';
      route();
    });
  }

  // ------------------------------------------------------------ runs list

  async function showRuns(gen) {
    show('runs-view');
    $('#crumb').textContent = '';
    document.title = 'gacd: runs';
    while (gen === generation) {
      const started = performance.now();
      try {
        await refreshRuns(gen);
        if (gen === generation) setBanner('');
      } catch (e) {
        if (gen === generation) showApiError(e, 'runs');
      }
      // Every 2 s, or less often when gacd takes long to answer.
      await sleep(Math.max(2000, 5 * (performance.now() - started)));
    }
  }

  async function refreshRuns(gen) {
    const runs = [];
    let pageToken = '';
    let serverNs = 0;
    for (let page = 0; page < 10; ++page) {  // the first 10,000 runs
      const q = '?page_size=1000' + (pageToken ? '&page_token=' + encodeURIComponent(pageToken) : '');
      const resp = await api('/api/v1/runs' + q);
      runs.push(...resp.runs);
      serverNs = Number(resp.server_time_ns);
      pageToken = resp.next_page_token;
      if (!pageToken) break;
    }
    const summaries = await mapLimit(runs, 4, (r) => api(runPath(r.run) + '/summary').catch(() => null));
    if (gen === generation) renderRuns(runs, summaries, serverNs);
  }

  function cell(tr, text, cls, name) {
    const td = document.createElement('td');
    td.textContent = text;
    if (cls) td.className = cls;
    if (name) td.dataset.field = name;
    tr.appendChild(td);
    return td;
  }

  function renderRuns(runs, summaries, serverNs) {
    const body = $('#runs-table tbody');
    const rows = [];
    runs.forEach((info, i) => {
      const s = summaries[i];
      const latest = s && s.latest;
      const config = decidedWith((s ? s.info.config : info.config) || {}, latest);
      const t = config.thresholds;
      const tr = document.createElement('tr');
      tr.dataset.run = info.run;
      const c = latest ? latest.cosine : null;
      if (t && c !== null && c !== undefined) {
        if (Math.abs(c) >= t.c_high) tr.className = 'skipping';
        else if (Math.abs(c) > t.c_low) tr.className = 'aligned';
      }
      const name = document.createElement('td');
      const a = document.createElement('a');
      a.href = '#/run/' + encodeURIComponent(info.run);
      a.textContent = info.run;
      name.appendChild(a);
      tr.appendChild(name);
      const lastStep = s ? s.info.last_step : info.last_step;
      cell(tr, fmtInt(lastStep), 'num', 'last-step');
      cell(tr, fmtFixed(c, 4), 'num', 'cosine');
      cell(tr, fmtThresholds(t), 'num', 'thresholds');
      // In monitor mode the counts are what GAC would have done (regime_labels).
      for (const r of REGIMES) {
        const td = cell(tr, s ? fmtInt(s.steps_by_regime[r]) : dash, 'num', 'count-' + r);
        const label = s && s.regime_labels ? s.regime_labels[r] : r;
        if (label !== r) {
          td.classList.add('would');
          td.title = label + ' (monitor mode: no update was changed)';
        }
      }
      cell(tr, latest && latest.staleness !== null ? fmtInt(latest.staleness) : dash, 'num', 'staleness');
      const lastSeen = Number(s ? s.info.last_seen_ns : info.last_seen_ns);
      cell(tr, fmtAge((serverNs - lastSeen) / 1e9), 'num', 'last-report');
      // The mode the run's steps ran in; the settings' mode when it differs.
      const stepsMode = (s ? s.info.steps_mode : info.steps_mode) || config.mode;
      const modeCell = cell(tr, stepsMode || dash, '', 'mode');
      if (config.mode && stepsMode !== config.mode) {
        modeCell.textContent = `${stepsMode} (set: ${config.mode})`;
      }
      if (stepsMode === 'monitor') modeCell.title = 'regime counts are what GAC would have done';
      rows.push(tr);
    });
    body.replaceChildren(...rows);
    $('#runs-empty').hidden = runs.length > 0;
  }

  // ------------------------------------------------------------ one run

  // Diverging colours for a cosine in [-1, 1], in 41 steps (so that the heat
  // map has few distinct fills): blue, white, red.
  function cosineColor(c) {
    if (c === null || c === undefined || !Number.isFinite(c)) return null;
    const q = Math.round(Math.max(-1, Math.min(1, c)) * 20) / 20;
    const lo = [33, 102, 172], mid = [247, 247, 247], hi = [178, 24, 43];
    const [a, b, t] = q < 0 ? [mid, lo, -q] : [mid, hi, q];
    const rgb = a.map((x, k) => Math.round(x + (b[k] - x) * t));
    return `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
  }

  // The step record's fields the "Latest step" card shows (gacd's
  // /api/v1/fields: label, decimals, place, from web/latest_step.h), asked
  // once per page load. When they cannot be had (a gacd without the
  // endpoint behind the same address) the run view still opens, with the
  // card's own rows only, and the next view asks again.
  let pageFields = null;  // the promise of the answer
  function latestFields() {
    if (!pageFields) {
      pageFields = api('/api/v1/fields').then(
        (resp) => resp.fields.filter((f) => f.page).sort((a, b) => a.page.place - b.page.place));
      pageFields.catch(() => { pageFields = null; });
    }
    return pageFields.catch(() => []);
  }
  // A field's element in the card: latest-<name, '_' as '-'>.
  const latestName = (f) => 'latest-' + f.name.replace(/_/g, '-');

  // Adds the fields' rows to the card, each before the first row placed
  // after it (once).
  function buildLatestCard(fields) {
    const dl = $('#latest-fields');
    if (dl.dataset.built || !fields.length) return;
    for (const f of fields) {
      const dt = document.createElement('dt');
      dt.textContent = f.page.label;
      dt.title = f.help + (f.unit ? ` (${f.unit})` : '');
      dt.dataset.place = String(f.page.place);
      const dd = document.createElement('dd');
      dd.dataset.field = latestName(f);
      dd.textContent = '–';
      const after = [...dl.querySelectorAll('dt')].find((x) => Number(x.dataset.place) > f.page.place);
      dl.insertBefore(dt, after || null);
      dl.insertBefore(dd, after || null);
    }
    dl.dataset.built = '1';
  }

  // A record field's value as the card shows it; `shownRegime` is the
  // regime's text (what GAC would have done, in monitor mode).
  function latestText(f, value, shownRegime) {
    if (value === null || value === undefined) return dash;
    if (f.name === 'regime') return shownRegime;
    switch (f.type) {
      case 'integer': return fmtInt(value);
      case 'real': return f.page.digits < 0 ? fmtNum(Number(value)) : fmtFixed(Number(value), f.page.digits);
      case 'bool': return value ? 'yes' : 'no';
      default: return String(value);
    }
  }

  // The step records of one rank, as columns (what uPlot draws).
  class Columns {
    constructor() {
      this.step = [];
      this.cosine = [];
      this.after = [];
      this.mean = [];
      this.gnorm = [];
      this.pnorm = [];
      this.regime = [];
      this.staleness = [];
      // The thresholds each step was decided with in the trainer (null: gacd's).
      this.clow = [];
      this.chigh = [];
      this.wlow = [];
      this.whigh = [];
      this.regimeColor = [];
      this.one = [];
      // The policy-health signals the trainer gave (null: none that step).
      this.essToken = [];
      this.essSequence = [];
      this.clipLow = [];
      this.clipHigh = [];
      this.policySteps = 0;  // steps with a signal
      this.scalars = new Map();  // name -> values, aligned with step
      this.last = null;  // the newest record
    }
    get length() {
      return this.step.length;
    }
    append(records) {
      for (const r of records) {
        const n = this.step.length;
        this.step.push(r.step);
        this.cosine.push(r.cosine);
        this.after.push(r.cosine_after);
        this.mean.push(r.window_mean === undefined ? null : r.window_mean);
        this.gnorm.push(r.grad_norm);
        this.pnorm.push(r.ref_norm);
        // A monitor-mode step's regime is what GAC would have done (as gacd's
        // regime_labels name it).
        const would = r.mode === 'monitor' && (r.regime === 'project' || r.regime === 'skip' || r.regime === 'spike');
        this.regime.push(!would ? r.regime : r.regime === 'spike' ? 'would skip (spike)' : 'would ' + r.regime);
        this.staleness.push(r.staleness);
        this.clow.push(r.c_low === undefined ? null : r.c_low);
        this.chigh.push(r.c_high === undefined ? null : r.c_high);
        this.wlow.push(r.window_c_low === undefined ? null : r.window_c_low);
        this.whigh.push(r.window_c_high === undefined ? null : r.window_c_high);
        this.regimeColor.push(REGIME_COLORS[r.regime] || '#999999');
        this.one.push(1);
        this.essToken.push(r.ess_token ?? null);
        this.essSequence.push(r.ess_sequence ?? null);
        this.clipLow.push(r.clip_fraction_low ?? null);
        this.clipHigh.push(r.clip_fraction_high ?? null);
        if (r.policy_tokens !== null && r.policy_tokens !== undefined) this.policySteps += 1;
        for (const name of Object.keys(r.scalars)) {
          if (!this.scalars.has(name)) this.scalars.set(name, new Array(n).fill(null));
        }
        for (const [name, values] of this.scalars) values.push(name in r.scalars ? r.scalars[name] : null);
        this.last = r;
      }
    }
    // Adds records that all come before the first one held.
    prepend(records) {
      const older = new Columns();
      older.append(records);
      const n = this.length;
      if (!this.last) this.last = older.last;
      for (const k of ['step', 'cosine', 'after', 'mean', 'gnorm', 'pnorm', 'regime', 'staleness', 'clow', 'chigh', 'wlow',
        'whigh', 'regimeColor', 'one', 'essToken', 'essSequence', 'clipLow', 'clipHigh']) {
        this[k] = older[k].concat(this[k]);
      }
      this.policySteps += older.policySteps;
      for (const name of new Set([...older.scalars.keys(), ...this.scalars.keys()])) {
        const a = older.scalars.get(name) || new Array(older.length).fill(null);
        const b = this.scalars.get(name) || new Array(n).fill(null);
        this.scalars.set(name, a.concat(b));
      }
    }
  }

  // Trainer scalars first in this order, the others after them by name.
  const SCALAR_ORDER = ['reward', 'loss', 'kl', 'entropy'];
  function scalarNames(columns) {
    const names = [...columns.scalars.keys()];
    const rank = (n) => (SCALAR_ORDER.includes(n) ? SCALAR_ORDER.indexOf(n) : SCALAR_ORDER.length);
    return names.sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  }

  function chartWidth() {
    return Math.max(320, $('#run-view').clientWidth - 40);
  }
  // Trainer scalars two to a row.
  function scalarWidth() {
    return Math.max(320, Math.floor((chartWidth() - 16) / 2));
  }

  class RunView {
    constructor(gen, run, rank, openedAt) {
      this.openedAt = openedAt;
      this.gen = gen;
      this.run = run;
      this.rank = rank;
      this.path = runPath(run);
      this.cols = new Columns();
      this.charts = [];       // charts whose x range is kept in step
      this.scalarCharts = new Map();
      this.heatmap = null;
      this.config = null;
      this.summary = null;
      this.clockOffsetMs = 0;  // server clock - Date.now()
      this.zoomed = false;
      this.syncing = false;
      this.hasLayers = false;
      this.configEdited = false;
      this.fields = [];  // the record fields of the "Latest step" card
    }

    alive() {
      return this.gen === generation;
    }

    async start() {
      show('run-view');
      $('#crumb').textContent = '/ ' + this.run;
      $('#run-title').textContent = this.run;
      document.title = 'gacd: ' + this.run;
      for (const id of ['chart-cosine', 'chart-window', 'chart-regime', 'chart-norms', 'chart-policy', 'chart-scalars',
        'heatmap']) {
        $('#' + id).replaceChildren();
      }
      $('#heatmap-section').hidden = true;
      $('#cfg-message').textContent = '';
      this.setupConfigForm();
      let head;
      try {
        // The run's info, settings and latest step, without reading its
        // history, and what the "Latest step" card shows.
        [head, this.fields] = await Promise.all([api(this.path + '/summary?window=1'), latestFields()]);
      } catch (e) {
        if (this.alive()) showApiError(e, 'run ' + this.run);
        return;
      }
      if (!this.alive()) return;
      setBanner('');
      buildLatestCard(this.fields);
      this.applyInfo(head.info, Number(head.server_time_ns));
      this.showConfig(head.info.config);
      this.liveLoop();
      this.heatmapLoop();
      await this.loadHistory(head.info);
    }

    applyInfo(info, serverNs) {
      this.info = info;
      this.clockOffsetMs = serverNs / 1e6 - Date.now();
      const select = $('#rank-select');
      const world = Math.max(1, info.world_size, this.rank + 1);
      if (select.options.length !== world) {
        select.replaceChildren(
          ...Array.from({ length: world }, (_, r) => new Option(String(r), String(r), false, r === this.rank)));
      }
      select.value = String(this.rank);
      select.onchange = () => {
        location.hash = '#/run/' + encodeURIComponent(this.run) + '?rank=' + select.value;
      };
    }

    // The records of the rank with from <= step < to (every page).
    async loadRange(from, to, layers = false) {
      const records = [];
      let pageToken = '';
      do {
        const q = `?start_step=${from}&end_step=${to}&rank=${this.rank}&page_size=${PAGE}` + (layers ? '&layers=1' : '') +
            (pageToken ? '&page_token=' + encodeURIComponent(pageToken) : '');
        const resp = await api(this.path + '/steps' + q);
        records.push(...resp.steps);
        pageToken = resp.next_page_token;
      } while (pageToken && this.alive());
      return records;
    }

    // The latest FIRST_BLOCK steps first (the charts are drawn from them),
    // then the older history in blocks of PAGE loaded side by side, each
    // added in front of what is shown once the blocks after it are in.
    async loadHistory(info) {
      const ranges = [];
      for (let to = info.last_step + 1, size = FIRST_BLOCK; to > info.first_step; size = PAGE) {
        const from = Math.max(info.first_step, to - size);
        ranges.push([from, to]);
        to = from;
      }
      const total = info.last_step - info.first_step + 1;
      const status = $('#history-status');
      const progress = () => {
        const loaded = this.cols.length ? this.cols.step[this.cols.length - 1] - this.cols.step[0] + 1 : 0;
        status.textContent = loaded < total ? `loading history: ${fmtInt(loaded)} of ${fmtInt(total)} steps` : '';
      };
      try {
        if (ranges.length) this.cols.append(await this.loadRange(...ranges[0]));
      } catch (e) {
        if (this.alive()) showApiError(e, 'steps of ' + this.run);
      }
      if (!this.alive()) return;
      this.buildCharts();
      this.updateLatest();
      this.summaryLoop();
      progress();
      const older = ranges.slice(1);
      const blocks = new Array(older.length);
      let next = 0;  // the next block to add in front
      try {
        await mapLimit(older, PARALLEL, async (range, i) => {
          blocks[i] = await this.loadRange(...range);
          if (!this.alive()) return;
          let added = false;
          for (; next < blocks.length && blocks[next]; ++next) {
            this.cols.prepend(blocks[next]);
            blocks[next] = [];  // release the records
            added = true;
          }
          if (added) {
            this.redraw();
            progress();
          }
        });
      } catch (e) {
        if (this.alive()) showApiError(e, 'history of ' + this.run);
      }
      if (this.alive()) document.body.dataset.historyMs = (performance.now() - this.openedAt).toFixed(1);
    }

    // ---------------------------------------------------------- charts

    baseOptions(title, height, series, extra = {}) {
      return Object.assign({
        title,
        width: chartWidth(),
        height,
        cursor: { sync: { key: 'gacd-' + this.gen }, drag: { x: true, y: false }, y: false },
        scales: { x: { time: false } },
        axes: [{ label: 'step' }, { size: 60 }],
        series: [{ label: 'step' }, ...series],
        hooks: { setScale: [(u, key) => key === 'x' && this.onZoom(u)] },
      }, extra);
    }

    // The bands at each step: the thresholds the step was decided with in
    // the trainer (local and monitor mode), else gacd's current ones.
    bands(low, high, t) {
      const lo = low.map((v) => (v === null ? t.c_low : v));
      const hi = high.map((v) => (v === null ? t.c_high : v));
      return [hi, lo, lo.map((v) => -v), hi.map((v) => -v)];
    }

    thresholdColumns() {
      return this.bands(this.cols.clow, this.cols.chigh, this.config.thresholds);
    }

    cosineData() {
      return [this.cols.step, this.cols.cosine, this.cols.after, ...this.thresholdColumns()];
    }

    // m_t of each step as gacd lists it (window_mean: the number of
    // gac_window_mean, with the run's current W), null until W cosines.
    windowData() {
      const t = this.config.window_thresholds || this.config.thresholds;
      return [this.cols.step, this.cols.mean, ...this.bands(this.cols.wlow, this.cols.whigh, t)];
    }

    policyData() {
      const c = this.cols;
      return [c.step, c.essToken, c.essSequence, c.clipHigh, c.clipLow];
    }

    buildCharts() {
      const c = this.cols;
      const dashed = [4, 4];
      const threshold = (label, color) => ({ label, stroke: color, width: 1, dash: dashed, points: { show: false } });
      this.cosineChart = new uPlot(this.baseOptions('c_t = cos(g_t, g_t-1), and the cosine after projection', 260, [
        { label: 'c_t', stroke: '#0969da', width: 1 },
        { label: 'after', stroke: '#fb8500', width: 1 },
        threshold('c_high', '#cf222e'),
        threshold('c_low', '#d4a72c'),
        threshold('-c_low', '#d4a72c'),
        threshold('-c_high', '#cf222e'),
      ], {
        bands: [{ series: [3, 4], fill: 'rgba(212,167,44,0.12)' }, { series: [5, 6], fill: 'rgba(212,167,44,0.12)' }],
        hooks: {
          setScale: [(u, key) => key === 'x' && this.onZoom(u)],
          draw: [() => this.markFirstChart()],
        },
      }), this.cosineData(), $('#chart-cosine'));

      this.windowChart = new uPlot(this.baseOptions(
        `m_t = signed mean of the last ${this.config.window || 20} c_t, and the windowed bands`, 200, [
          { label: 'm_t', stroke: '#1a7f37', width: 1.5 },
          threshold('window c_high', '#cf222e'),
          threshold('window c_low', '#d4a72c'),
          threshold('-window c_low', '#d4a72c'),
          threshold('-window c_high', '#cf222e'),
        ], { bands: [{ series: [2, 3], fill: 'rgba(212,167,44,0.12)' }, { series: [4, 5], fill: 'rgba(212,167,44,0.12)' }] }),
      this.windowData(), $('#chart-window'));

      const regimeBars = uPlot.paths.bars({
        size: [1, Infinity, 1],
        disp: { fill: { unit: 3, values: () => this.cols.regimeColor } },
      });
      this.regimeChart = new uPlot(this.baseOptions('regime of each step', 110, [{
        label: 'regime', width: 0, fill: '#999999', fillTo: 0, paths: regimeBars, points: { show: false },
        value: (u, v, sidx, idx) => (idx === null || idx === undefined ? dash : this.cols.regime[idx] || dash),
      }], {
        scales: { x: { time: false }, y: { range: [0, 1] } },
        axes: [{ label: 'step' }, { size: 60, values: () => [] , ticks: { show: false }, grid: { show: false } }],
      }), [c.step, c.one], $('#chart-regime'));

      this.normsChart = new uPlot(this.baseOptions('gradient norms', 200, [
        { label: '‖g‖', stroke: '#8250df', width: 1 },
        { label: '‖p‖ (previous)', stroke: '#6e7781', width: 1 },
      ]), [c.step, c.gnorm, c.pnorm], $('#chart-norms'));

      // Shown once a step carries the trainer's policy-health signals.
      this.policyChart = new uPlot(this.baseOptions(
        'policy health: ESS of the importance weights, fractions of tokens clipped', 200, [
          { label: 'ESS (tokens)', stroke: '#0969da', width: 1.5 },
          { label: 'ESS (sequences)', stroke: '#54aeff', width: 1, dash: dashed },
          { label: 'clipped high', stroke: '#cf222e', width: 1 },
          { label: 'clipped low', stroke: '#d4a72c', width: 1 },
        ], { scales: { x: { time: false }, y: { range: [0, 1] } } }), this.policyData(), $('#chart-policy'));
      $('#chart-policy').hidden = c.policySteps === 0;
      this.charts = [this.cosineChart, this.windowChart, this.regimeChart, this.normsChart, this.policyChart];
      this.syncScalarCharts();
      window.addEventListener('resize', this.onResize = () => this.resize());
    }

    // Time until the first chart has been drawn with the run's latest steps:
    // since the page's navigation for the page's first view, else since the
    // view was opened.
    markFirstChart() {
      if (this.firstDrawn) return;
      this.firstDrawn = true;
      document.body.dataset.firstChartMs = (performance.now() - this.openedAt).toFixed(1);
      document.body.dataset.firstChartSteps = String(this.cols.length);
    }

    // One chart per trainer scalar, created when a scalar first appears.
    syncScalarCharts() {
      for (const name of scalarNames(this.cols)) {
        if (this.scalarCharts.has(name)) continue;
        const div = document.createElement('div');
        div.className = 'chart';
        div.dataset.scalar = name;
        $('#chart-scalars').appendChild(div);
        const options = this.baseOptions(name, 150, [{ label: name, stroke: '#1a7f37', width: 1 }]);
        options.width = scalarWidth();
        const chart = new uPlot(options, [this.cols.step, this.cols.scalars.get(name)], div);
        this.scalarCharts.set(name, chart);
        this.charts.push(chart);
      }
    }

    resize() {
      if (!this.alive()) return;
      const width = chartWidth();
      for (const chart of [...this.charts, this.heatmap].filter(Boolean)) {
        const scalar = [...this.scalarCharts.values()].includes(chart);
        chart.setSize({ width: scalar ? scalarWidth() : width, height: chart.height });
      }
    }

    // Keeps the x range of every chart the same, and loads the layers of a
    // zoomed range that is short enough.
    onZoom(u) {
      if (this.syncing || !this.charts.includes(u)) return;
      const { min, max } = u.scales.x;
      const steps = this.cols.step;
      this.zoomed = steps.length > 0 && (min > steps[0] || max < steps[steps.length - 1]);
      this.syncing = true;
      for (const chart of this.charts) {
        if (chart !== u) chart.setScale('x', { min, max });
      }
      this.syncing = false;
      if (this.hasLayers) this.loadHeatmap();
    }

    redraw() {
      const c = this.cols;
      const keep = !this.zoomed;  // a zoomed view keeps its range
      this.cosineChart.setData(this.cosineData(), keep);
      this.windowChart.setData(this.windowData(), keep);
      this.regimeChart.setData([c.step, c.one], keep);
      this.normsChart.setData([c.step, c.gnorm, c.pnorm], keep);
      this.policyChart.setData(this.policyData(), keep);
      $('#chart-policy').hidden = c.policySteps === 0;
      this.syncScalarCharts();
      for (const [name, chart] of this.scalarCharts) chart.setData([c.step, c.scalars.get(name)], keep);
    }

    // ---------------------------------------------------------- live data

    async liveLoop() {
      while (this.alive()) {
        await sleep(POLL_MS);
        if (!this.alive()) return;
        if (!this.cosineChart) continue;  // the latest steps are not drawn yet
        try {
          let more = true;
          while (more && this.alive()) {
            const last = this.cols.length ? this.cols.step[this.cols.length - 1] : -1;
            const resp = await api(`${this.path}/steps?start_step=${last + 1}&rank=${this.rank}&page_size=${PAGE}`);
            if (!this.alive()) return;
            if (resp.steps.length) {
              this.cols.append(resp.steps);
              this.redraw();
              this.updateLatest();
            }
            more = Boolean(resp.next_page_token);
          }
          setBanner('');
        } catch (e) {
          if (this.alive()) showApiError(e, 'live steps');
        }
      }
    }

    // The summary (regime counts and calibration over the whole run) reads
    // every step of rank 0: refreshed every 3 s, or less often for a run
    // whose summary takes long.
    async summaryLoop() {
      while (this.alive()) {
        const started = performance.now();
        try {
          const s = await api(this.path + '/summary');
          if (!this.alive()) return;
          this.summary = s;
          this.applyInfo(s.info, Number(s.server_time_ns));
          this.showSummary(s);
          if (!this.configEdited && s.info.config.version !== this.config.version) this.showConfig(s.info.config);
        } catch (e) {
          if (this.alive()) showApiError(e, 'summary');
        }
        await sleep(Math.max(3000, 10 * (performance.now() - started)));
      }
    }

    updateLatest() {
      const c = this.cols;
      const i = c.length - 1;
      if (i < 0) return;
      for (const f of this.fields) field(latestName(f)).textContent = latestText(f, c.last[f.name], c.regime[i]);
      field('latest-window-mean').textContent = fmtFixed(c.mean[i], 4);
      field('latest-rule').textContent = c.clow[i] === null
        ? 'gacd’s settings (below)'
        : `${fmtThresholds({ c_low: c.clow[i], c_high: c.chigh[i] })}, in the trainer`;
      this.tickAge();
    }

    tickAge() {
      if (!this.info) return;
      const nowMs = Date.now() + this.clockOffsetMs;
      field('last-report').textContent = fmtAge((nowMs - Number(this.info.last_seen_ns) / 1e6) / 1000);
    }

    showSummary(s) {
      for (const r of REGIMES) {
        field('count-' + r).textContent = fmtInt(s.steps_by_regime[r]);
        field('label-' + r).textContent = s.regime_labels ? s.regime_labels[r] : r;
      }
      field('steps-mode').textContent = s.info.steps_mode || dash;
      const cal = s.calibration;
      field('cal-count').textContent = fmtInt(cal.count);
      field('cal-q90').textContent = fmtFixed(cal.q90, 4);
      field('cal-max').textContent = fmtFixed(cal.max, 4);
      field('cal-mean').textContent = fmtFixed(cal.mean, 4);
      field('cal-frac').textContent = cal.count ? (100 * cal.fraction_le_c_low).toFixed(1) + ' %' : dash;
      field('cal-suggested').textContent = cal.suggested ? fmtThresholds(cal.suggested) : 'too few steps';
      this.tickAge();
    }

    // ---------------------------------------------------------- thresholds

    showConfig(config) {
      const first = this.config === null;
      // The steps held were listed with the old W: list them again.
      const windowChanged = !first && (this.config.window || 20) !== (config.window || 20);
      this.config = config;
      const t = config.thresholds;
      $('#cfg-c-low').value = String(t.c_low);
      $('#cfg-c-high').value = String(t.c_high);
      $('#cfg-alpha-mode').value = t.alpha_mode;
      $('#cfg-mode').value = config.mode;
      const w = config.window_thresholds || t;
      $('#cfg-trigger').value = config.trigger || 'per_step';
      $('#cfg-window').value = String(config.window || 20);
      $('#cfg-window-c-low').value = String(w.c_low);
      $('#cfg-window-c-high').value = String(w.c_high);
      field('config-version').textContent = config.version
        ? `version ${config.version}, by ${config.updated_by}`
        : 'server defaults';
      this.configEdited = false;
      if (windowChanged) {
        route();
        return;
      }
      if (!first && this.cosineChart) this.cosineChart.setData(this.cosineData(), !this.zoomed);
      if (!first && this.windowChart) this.windowChart.setData(this.windowData(), !this.zoomed);
    }

    setupConfigForm() {
      const form = $('#config-form');
      form.oninput = () => {
        this.configEdited = true;
      };
      form.onsubmit = async (ev) => {
        ev.preventDefault();
        const message = $('#cfg-message');
        message.className = 'message';
        message.textContent = 'saving…';
        const body = {
          thresholds: {
            c_low: Number($('#cfg-c-low').value),
            c_high: Number($('#cfg-c-high').value),
            alpha_mode: $('#cfg-alpha-mode').value,
          },
          mode: $('#cfg-mode').value,
          trigger: $('#cfg-trigger').value,
          window: Number($('#cfg-window').value),
          window_thresholds: {
            c_low: Number($('#cfg-window-c-low').value),
            c_high: Number($('#cfg-window-c-high').value),
            alpha_mode: $('#cfg-alpha-mode').value,
          },
          reason: $('#cfg-reason').value,
          expected_version: this.config.version,
        };
        try {
          const resp = await api(this.path + '/config', {
            method: 'PUT',
            headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify(body),
          });
          if (!this.alive()) return;
          this.showConfig(resp.config);
          $('#cfg-reason').value = '';
          message.className = 'message ok';
          message.textContent = `saved: version ${resp.config.version}`;
        } catch (e) {
          if (!this.alive()) return;
          message.className = 'message error';
          message.textContent = e.message;  // the server's own words
          message.dataset.code = e.code;
          if (e.status === 401) $('#token-panel').hidden = false;
        }
      };
    }

    // ---------------------------------------------------------- heat map

    // Shows the layers of the zoomed range when it is short enough, else of
    // the last HEATMAP_STEPS steps; refreshed while the run reports.
    async heatmapLoop() {
      const c = this.cols;
      while (this.alive() && !this.cosineChart) await sleep(100);
      if (!c.length) return;
      try {
        const probe = await api(`${this.path}/steps?start_step=${c.step[c.length - 1]}&rank=${this.rank}&layers=1&page_size=1`);
        this.hasLayers = probe.steps.length > 0 && probe.steps[0].layers.length > 0;
      } catch (e) {
        return;
      }
      if (!this.hasLayers || !this.alive()) return;
      $('#heatmap-section').hidden = false;
      while (this.alive()) {
        await this.loadHeatmap();
        await sleep(3000);
      }
    }

    heatmapWanted() {
      const c = this.cols;
      const last = c.step[c.length - 1];
      if (this.zoomed) {
        const { min, max } = this.cosineChart.scales.x;
        if (max - min <= HEATMAP_MAX_STEPS) return [Math.max(0, Math.ceil(min)), Math.floor(max) + 1];
      }
      return [Math.max(0, last - HEATMAP_STEPS + 1), last + 1];
    }

    async loadHeatmap() {
      const [from, to] = this.heatmapWanted();
      const seq = (this.heatmapSeq = (this.heatmapSeq || 0) + 1);  // only the latest request draws
      try {
        const records = await this.loadRange(from, to, true);
        if (this.alive() && seq === this.heatmapSeq) this.drawHeatmap(records, from, to);
      } catch (e) {
        if (this.alive()) showApiError(e, 'layers');
      }
    }

    drawHeatmap(records, from, to) {
      const names = [];
      const index = new Map();
      for (const r of records) {
        for (const l of r.layers) {
          if (!index.has(l.name)) {
            index.set(l.name, names.length);
            names.push(l.name);
          }
        }
      }
      const steps = records.map((r) => r.step);
      const cos = names.map(() => new Array(records.length).fill(null));
      records.forEach((r, i) => {
        for (const l of r.layers) cos[index.get(l.name)][i] = l.cosine;
      });
      // Layer k is a row of bars from k to k + 1, each filled by its cosine.
      const data = [steps, ...cos.map((col, k) => col.map((v) => (v === null ? null : k + 1)))];
      const fills = cos.map((col) => col.map(cosineColor));
      $('#heatmap-range').textContent = `steps ${fmtInt(from)}–${fmtInt(to - 1)} of rank ${this.rank}; ` +
          'blue −1, white 0, red +1';
      const sameLayers = this.heatmap && this.heatmapNames && this.heatmapNames.join('\n') === names.join('\n');
      this.heatmapCos = cos;
      this.heatmapFills = fills;
      this.heatmapSteps = steps;
      if (sameLayers) {
        this.heatmap.setData(data, true);
        return;
      }
      if (this.heatmap) this.heatmap.destroy();
      this.heatmapNames = names;
      const series = names.map((name, k) => ({
        label: name,
        width: 0,
        fill: '#cccccc',
        fillTo: k,
        points: { show: false },
        paths: uPlot.paths.bars({
          size: [1, Infinity, 1],
          disp: { fill: { unit: 3, values: (u, sidx) => this.heatmapFills[sidx - 1] } },
        }),
      }));
      const rowPx = names.length > 40 ? 10 : 16;
      this.heatmap = new uPlot({
        width: chartWidth(),
        height: Math.max(160, names.length * rowPx + 60),
        legend: { show: false },
        cursor: { sync: { key: 'gacd-' + this.gen }, drag: { x: true, y: false }, points: { show: false }, y: false },
        scales: { x: { time: false }, y: { range: [0, names.length] } },
        axes: [
          { label: 'step' },
          {
            size: 140,
            splits: () => names.map((_, k) => k + 0.5),
            values: (u, splits) => splits.map((v) => names[Math.floor(v)] || ''),
            grid: { show: false },
          },
        ],
        series: [{ label: 'step' }, ...series],
        hooks: { setCursor: [(u) => this.heatmapHover(u)] },
      }, data, $('#heatmap'));
      // The readout names a layer only under the mouse (other charts move
      // this cursor too, but only along the steps).
      this.heatmap.over.addEventListener('mouseenter', () => { this.overHeatmap = true; });
      this.heatmap.over.addEventListener('mouseleave', () => { this.overHeatmap = false; });
    }

    heatmapHover(u) {
      const out = $('#heatmap-hover');
      const i = u.cursor.idx;
      if (!this.overHeatmap || i === null || i === undefined || u.cursor.top < 0) {
        out.textContent = '\u00a0';
        return;
      }
      const k = Math.floor(u.posToVal(u.cursor.top, 'y'));
      const name = this.heatmapNames[k];
      if (name === undefined) return;
      out.textContent = `${name} · step ${fmtInt(this.heatmapSteps[i])} · cosine ${fmtFixed(this.heatmapCos[k][i], 4)}`;
    }

    stop() {
      if (this.onResize) window.removeEventListener('resize', this.onResize);
    }
  }

  // ------------------------------------------------------------ routing

  let current = null;

  function route() {
    const gen = ++generation;
    const openedAt = gen === 1 ? 0 : performance.now();
    delete document.body.dataset.firstChartMs;
    delete document.body.dataset.firstChartSteps;
    if (current) current.stop();
    current = null;
    setBanner('');
    const hash = location.hash || '#/';
    const m = /^#\/run\/([^?]*)(?:\?rank=(\d+))?$/.exec(hash);
    if (m) {
      current = new RunView(gen, decodeURIComponent(m[1]), m[2] ? Number(m[2]) : 0, openedAt);
      current.start();
    } else {
      showRuns(gen);
    }
  }

  setupToken();
  window.addEventListener('hashchange', route);
  setInterval(() => {
    tickStatus();
    if (current && current.alive()) current.tickAge();
  }, 1000);
  route();
})();
