// The run viewer's page: plain JavaScript, no framework and no build step.
// Two views: the runs list ("/") and one run ("/runs/<id>"). A run's rows come from the
// server's timeline (alpineagents.viewer.timeline) over Server-Sent Events: the last
// rows (the run opens at its end), then only rows that are new or changed. Other rows
// are asked for a page at a time as they scroll into view (/rows), each row a compact
// list whose fields the message names once ("columns"). Only the rows in view are in the
// DOM, and an update costs what it changed (a turn's bars are re-measured from that
// turn's rows only), so a history of any length opens and scrolls smoothly.
"use strict";

const app = document.getElementById("app");
const ROW = 28; // px, as --row in viewer.css
const OVERSCAN = 12;
const PAGE = 200; // rows asked for at a time
let about = { approvals: false, store: "", cluster: null };
let leaveView = () => {};

// The approval token the viewer printed in its address (?token=...), as Jupyter does:
// kept for this tab, taken out of the address bar (not left in history or a screenshot),
// sent with each approval.
const approvalToken = (() => {
  const url = new URL(location.href);
  const given = url.searchParams.get("token");
  if (given) {
    sessionStorage.setItem("approval-token", given);
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
  return sessionStorage.getItem("approval-token") || "";
})();

// ------------------------------------------------------------------ small pieces
function esc(text) {
  return String(text ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
// Times are epoch milliseconds in a run's rows, ISO text in the runs list.
function ms(time) { return typeof time === "number" ? time : time ? Date.parse(time) : NaN; }
function clock(time) {
  const t = ms(time);
  if (!isFinite(t)) return "";
  const d = new Date(t);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
}
function duration(millis) {
  if (!isFinite(millis) || millis < 0) return "";
  if (millis < 1000) return `${Math.round(millis)} ms`;
  const s = millis / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}
function age(iso) {
  const t = ms(iso);
  if (!isFinite(t)) return "";
  return duration(Date.now() - t).replace(/ \d+ (s|min)$/, "") + " ago";
}
function tokens(n) {
  n = Number(n || 0);
  if (n >= 1e6) return `${(n / 1e6).toFixed(n >= 1e8 ? 0 : 1)}M`;
  return n >= 10000 ? `${(n / 1000).toFixed(n >= 100000 ? 0 : 1)}k` : String(n);
}
function badge(status, text) {
  return `<span class="badge ${esc(status)}">${esc(text ?? status.replace(/_/g, " "))}</span>`;
}
async function getJSON(url, options) {
  const response = await fetch(url, options);
  const body = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
  if (!response.ok) throw new Error(body.error || `${response.status}`);
  return body;
}
function showAbout() {
  const where = [about.store, about.cluster ? `AgentRuns of ${about.cluster}` : ""].filter(Boolean).join(" · ");
  document.getElementById("where").textContent = where;
  const mode = document.getElementById("mode");
  mode.textContent = about.approvals ? "answers approvals" : "read-only";
  mode.className = about.approvals ? "mode write" : "mode";
}
function runUrl(id) { return `/runs/${encodeURIComponent(id)}`; }
function apiUrl(id, tail) { return `/api/runs/${encodeURIComponent(id)}/${tail}`; }

// ------------------------------------------------------------------ routing
function route() {
  leaveView();
  leaveView = () => {};
  closeDetail();
  const path = location.pathname;
  if (path.startsWith("/runs/")) showRun(decodeURIComponent(path.slice(6)));
  else showRuns();
}
document.addEventListener("click", (event) => {
  const link = event.target.closest("a[href^='/']");
  if (!link || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
  event.preventDefault();
  history.pushState(null, "", link.getAttribute("href"));
  route();
});
window.addEventListener("popstate", route);

// ------------------------------------------------------------------ the runs list
const FILTERS = {
  all: () => true,
  going: (r) => r.group === "going",
  waiting: (r) => r.group === "waiting",
  answered: (r) => r.group === "answered",
  stopped: (r) => r.group === "stopped",
};
let runsFilter = "all";
let runsQuery = "";

function statusOf(run) {
  const phase = run.cluster && run.cluster.phase;
  const stopped = run.stopped;
  const process = !phase && !stopped ? run.process : null; // lost, waiting_for_resume, ...
  let status = phase || stopped || (process && process !== "running" ? process : run.saved ? "open" : "Pending");
  let group = process === "lost" ? "stopped" : process === "waiting_for_resume" ? "waiting" : "going";
  if (stopped === "waiting_for_approval" || phase === "WaitingForApproval" || phase === "Queued") group = "waiting";
  else if (phase === "Succeeded" || (!phase && stopped === "answered")) group = "answered";
  else if (phase === "Failed" || phase === "Suspended" || phase === "Interrupted" || (!phase && stopped && stopped !== "answered")) group = "stopped";
  return { status, group };
}

function showRuns() {
  document.title = "alpineagents runs";
  app.innerHTML = `
    <section class="runs">
      <div class="toolbar">
        <input type="search" id="search" placeholder="Search id, prompt, answer, namespace" value="${esc(runsQuery)}" aria-label="Search runs">
        <div class="chips" id="chips">${Object.keys(FILTERS).map((f) => `<button type="button" data-filter="${f}" class="${f === runsFilter ? "on" : ""}">${f}</button>`).join("")}</div>
        <span class="count" id="count"></span>
      </div>
      <div id="problem"></div>
      <table class="list" id="runs"><thead></thead><tbody></tbody></table>
    </section>`;
  let runs = [];
  let cluster = false;
  const render = () => {
    const query = runsQuery.trim().toLowerCase();
    const shown = runs.filter((r) => FILTERS[runsFilter](r) && (!query || r.haystack.includes(query)));
    document.getElementById("count").textContent = `${shown.length} of ${runs.length} runs`;
    const head = cluster
      ? `<th class="col-id">Run</th><th class="col-status">Status</th><th class="col-phase">Phase</th><th class="col-tiny num">Attempt</th><th class="col-tiny num">Restarts</th><th class="col-tiny num">Age</th>`
      : `<th class="col-id">Run</th><th class="col-status">Status</th><th class="col-tiny num" title="Processes that ran it: more than one means it was resumed after a stop or a crash">Attempts</th><th class="col-tiny num" title="Tool calls closed as aborted (its process was lost or interrupted)">Aborted</th>`;
    document.getElementById("runs").classList.toggle("cluster", cluster);
    document.querySelector("#runs thead").innerHTML = `<tr>${head}<th class="col-small num">Entries</th><th class="col-small num">Turns</th><th class="col-tokens num">Tokens in/out</th><th class="col-when">Updated</th><th class="col-prompt">Prompt</th></tr>`;
    document.querySelector("#runs tbody").innerHTML = shown.map((r) => {
      const c = r.cluster;
      const usage = r.usage && (r.usage.input_tokens || r.usage.output_tokens) ? r.usage : (c ? c.usage : {});
      const nest = r.depth ? `<span class="nest">${"&nbsp;&nbsp;&nbsp;".repeat(r.depth - 1)}↳ </span>` : "";
      const label = c ? `${c.namespace}/${c.name}` : r.id;
      const title = c ? `${label} (State ${r.id})` : r.id;
      const kids = r.children ? ` <span class="count">(${r.children} subagent${r.children > 1 ? "s" : ""})</span>` : "";
      const name = r.saved ? `<a href="${runUrl(r.id)}" title="${esc(title)}">${esc(label)}</a>` : `<span title="not saved yet">${esc(label)}</span>`;
      const clusterCells = cluster
        ? `<td>${c ? badge(c.phase || "Pending", c.phase || "—") : ""}</td><td class="num">${c ? c.attempt : ""}</td><td class="num">${c ? c.restarts : ""}</td><td class="num">${c ? esc(age(c.created_at).replace(" ago", "")) : ""}</td>`
        : `<td class="num attempts${r.attempts > 1 ? " crashed" : ""}">${r.attempts ?? ""}</td><td class="num aborted${r.aborted_calls ? " crashed" : ""}">${r.aborted_calls ?? ""}</td>`;
      return `<tr data-id="${esc(r.id)}"><td class="id">${nest}${name}${kids}</td><td>${badge(r.cluster ? r.stopped || (r.saved ? "open" : "Pending") : r.status)}</td>${clusterCells}<td class="num col-small">${r.entries}</td><td class="num col-small">${r.turns}</td><td class="num col-tokens">${tokens(usage.input_tokens)} / ${tokens(usage.output_tokens)}</td><td class="col-when" title="${esc(r.updated_at || "")}">${esc(age(r.updated_at))}</td><td class="prompt" title="${esc(r.first_message || "")}">${esc(r.first_message || "")}</td></tr>`;
    }).join("") || `<tr><td colspan="12" class="count">No runs${runs.length ? " match" : " saved in this store yet"}.</td></tr>`;
  };
  const load = async () => {
    try {
      const body = await getJSON("/api/runs");
      about = body;
      showAbout();
      cluster = Boolean(body.cluster);
      runs = body.runs.map((r) => ({
        ...r,
        ...statusOf(r),
        haystack: [r.id, r.first_message, r.answer, r.stopped, r.cluster && `${r.cluster.namespace}/${r.cluster.name} ${r.cluster.phase}`].join(" ").toLowerCase(),
      }));
      document.getElementById("problem").innerHTML = body.cluster_error ? `<div class="problem">AgentRuns: ${esc(body.cluster_error)}</div>` : "";
      render();
    } catch (error) {
      document.getElementById("problem").innerHTML = `<div class="problem">${esc(error.message)}</div>`;
    }
  };
  document.getElementById("search").addEventListener("input", (e) => { runsQuery = e.target.value; render(); });
  document.getElementById("chips").addEventListener("click", (e) => {
    const button = e.target.closest("button");
    if (!button) return;
    runsFilter = button.dataset.filter;
    for (const b of document.querySelectorAll("#chips button")) b.classList.toggle("on", b === button);
    render();
  });
  load();
  // The list is the stores' small info documents only (no history); refresh it now and then.
  const timer = setInterval(() => { if (!document.hidden) load(); }, 5000);
  leaveView = () => clearInterval(timer);
}

// ------------------------------------------------------------------ one run
function showRun(id) {
  document.title = `${id} · alpineagents`;
  app.innerHTML = `
    <section class="run" data-run="${esc(id)}">
      <div class="run-head">
        <div class="titles">
          <h1><a href="/" title="All runs">Runs</a> / <span class="id" title="${esc(id)}">${esc(id)}</span> <span id="run-status"></span> <a id="trace-link" target="_blank" rel="noopener" hidden>trace ↗</a></h1>
          <div class="facts" id="facts">loading…</div>
        </div>
        <div class="plot" id="plot"></div>
      </div>
      <div id="problem"></div>
      <div class="callout note" id="process-note" hidden></div>
      <div class="callout approvals" id="approvals" hidden></div>
      <div class="callout answer" id="answer" hidden></div>
      <div class="timeline">
        <div class="tl-tools">
          <input type="search" id="row-search" placeholder="Search rows: tool, text, outcome" aria-label="Search this run's rows">
          <label class="toggle"><input type="checkbox" id="errors-only"> errors only</label>
          <span class="count" id="row-count"></span>
        </div>
        <div class="grid tl-head"><div>#</div><div>time</div><div>what</div><div>text</div><div>duration in its turn</div><div></div></div>
        <div class="viewport" id="viewport"><div class="spacer" id="spacer"></div></div>
        <button type="button" class="jump" id="jump">new entries ↓</button>
      </div>
    </section>`;
  const viewport = document.getElementById("viewport");
  const spacer = document.getElementById("spacer");
  const rows = []; // by position in the run's timeline; a hole: not asked for yet
  const turns = new Map(); // turn -> {start, end} in ms, the window its bars are drawn in
  const turnRows = new Map(); // turn -> positions of its rows
  const asked = new Set(); // pages asked for (a page: positions PAGE * n to PAGE * (n + 1))
  let followId = null; // the server's follow of this run, which pages come from
  let summary = null, info = {}, cluster = null, openRow = null, chosen = {};
  let process = null; // "running", "lost" (its run lock is free) or null: unknown
  let frame = 0;
  // A search or "errors only": the server filters the whole timeline (the page holds only
  // the rows in view); the view is the kept rows' orders by their position among them.
  const filter = { q: "", errors: false };
  const filtering = () => Boolean(filter.q.trim() || filter.errors);
  let view = []; // position in the filtered list -> the row's order
  let viewTotal = 0;
  let viewGen = 0; // a new filter, or new rows while filtering: the pages are asked anew
  const viewAsked = new Set(); // pages of the filtered list asked for in this generation

  const live = () => summary && summary.stopped === null && process !== "lost";
  const turnWindow = (turn) => {
    const w = turns.get(turn);
    if (!w) return null;
    const end = w.open && live() ? Math.max(w.end, Date.now()) : w.end;
    return { start: w.start, end: Math.max(end, w.start + 1) };
  };
  const noteTurn = (row) => {
    if (row.turn === null || row.turn === undefined) return;
    const start = ms(row.start), end = ms(row.end);
    const w = turns.get(row.turn) || { start: Infinity, end: -Infinity, open: false };
    if (isFinite(start)) w.start = Math.min(w.start, start);
    if (isFinite(end)) w.end = Math.max(w.end, end);
    else if (isFinite(start)) w.end = Math.max(w.end, start);
    w.open = w.open || row.status === "running";
    turns.set(row.turn, w);
  };
  const recomputeTurn = (turn) => {
    turns.delete(turn);
    for (const at of turnRows.get(turn) || []) if (rows[at]) noteTurn(rows[at]);
  };
  const place = (columns, list) => {
    const touchedTurns = new Set();
    for (const values of list) {
      const row = {};
      for (let i = 0; i < columns.length; i++) row[columns[i]] = values[i];
      // A call's # is its latest entry (its result once it has one), as Row.seq says.
      row.seq = row.seqs.length ? row.seqs[row.kind === "call" ? row.seqs.length - 1 : 0] : null;
      rows[row.order] = row;
      if (row.turn !== null && row.turn !== undefined) {
        touchedTurns.add(row.turn);
        const mine = turnRows.get(row.turn) || [];
        if (!mine.includes(row.order)) mine.push(row.order);
        turnRows.set(row.turn, mine);
      }
    }
    for (const turn of touchedTurns) recomputeTurn(turn);
  };
  const total = () => (filtering() ? viewTotal : summary ? summary.rows : 0);
  const askFor = async (page) => {
    const filtered = filtering();
    const pages = filtered ? viewAsked : asked;
    if (pages.has(page) || followId === null) return;
    pages.add(page);
    const asking = followId, gen = viewGen;
    const current = () => asking === followId && (!filtered || gen === viewGen);
    let url = `${apiUrl(id, "rows")}?follow=${encodeURIComponent(asking)}&start=${page * PAGE}&end=${(page + 1) * PAGE}`;
    if (filtered) url += `&q=${encodeURIComponent(filter.q.trim())}${filter.errors ? "&errors=1" : ""}`;
    try {
      const body = await getJSON(url);
      if (!current()) return; // the stream started over, or the filter changed, meanwhile
      place(body.columns, body.rows);
      if (filtered) {
        for (let k = 0; k < body.matches.length; k++) view[body.start + k] = body.matches[k];
        viewTotal = body.total_rows;
        if (view.length > viewTotal) view.length = viewTotal;
        showCount();
      }
      repaint();
    } catch (error) {
      if (current()) pages.delete(page);
      document.getElementById("problem").innerHTML = `<div class="problem">${esc(error.message)}</div>`;
    }
  };

  const rowHtml = (row, position) => {
    const top = position * ROW;
    const open = openRow === row.id ? " open" : "";
    if (row.kind === "attempt") {
      return `<div class="tl-row attempt ${esc(row.status)} grid" style="top:${top}px" data-order="${row.order}"><div class="seq"></div><div class="span"><b>${esc(clock(row.start))} ▸ ${esc(row.title)}</b> — ${esc(row.text)}</div></div>`;
    }
    let bar = "", dur = "";
    const start = ms(row.start);
    const running = row.status === "running" || row.status === "asking";
    const end = isFinite(ms(row.end)) ? ms(row.end) : (running && live() ? Date.now() : NaN);
    if (row.turn !== null && row.turn !== undefined && isFinite(start)) {
      const w = turnWindow(row.turn);
      if (w) {
        const span = w.end - w.start;
        const left = ((start - w.start) / span) * 100;
        const width = isFinite(end) ? ((end - start) / span) * 100 : 0;
        const kind = row.kind === "model" ? "model " : "";
        bar = `<div class="lane"><div class="bar ${kind}${esc(row.status)}" style="left:${left.toFixed(2)}%;width:${Math.max(width, 0.6).toFixed(2)}%"></div></div>`;
      }
      // A lost call's end is its process's last save: it ran at least this long.
      if (isFinite(end)) dur = (row.lost ? "≥ " : "") + duration(end - start);
    }
    const kindLabel = { message: row.title, model: "model", call: "tool", sent: "sent", compaction: "compaction", stop: "stop", note: row.title }[row.kind] || row.kind;
    const name = row.kind === "call" ? `<span class="k">tool</span>${esc(row.title)}` : row.kind === "model" ? `<span class="k">model</span>` : esc(kindLabel);
    // A call or request still open when its process was lost is not running: say so.
    const shown = running && process === "lost" ? "lost" : row.status;
    const status = shown && row.kind !== "message" ? badge(shown, shown === "answer" ? "answer" : undefined) : "";
    const textClass = row.status === "answer" ? "txt answer" : "txt";
    return `<div class="tl-row ${esc(row.kind)}${open} grid" style="top:${top}px" data-order="${row.order}" title="${esc(row.text)}"><div class="seq">${row.seq ?? ""}</div><div class="time">${esc(clock(row.start))}</div><div class="what">${name}</div><div class="${textClass}">${status} ${esc(row.text)}</div><div>${bar}</div><div class="dur">${esc(dur)}</div></div>`;
  };

  // The rows in the DOM by position, with the HTML each was made from: a paint replaces
  // only rows whose HTML changed, so an element under the pointer stays while pages of
  // other rows arrive (a click whose target is replaced between press and release is lost).
  const shown = new Map();
  const paint = () => {
    frame = 0;
    spacer.style.height = `${total() * ROW}px`;
    const first = Math.max(0, Math.floor(viewport.scrollTop / ROW) - OVERSCAN);
    const last = Math.min(total(), Math.ceil((viewport.scrollTop + viewport.clientHeight) / ROW) + OVERSCAN);
    for (const [at, [, element]] of shown) {
      if (at < first || at >= last) { element.remove(); shown.delete(at); }
    }
    for (let i = first; i < last; i++) {
      let html;
      const order = filtering() ? view[i] : i;
      // While filtering, a page of the view is asked anew after new rows (it may keep
      // other rows now); the rows it showed stay until the answer comes.
      if (filtering() && !viewAsked.has(Math.floor(i / PAGE))) askFor(Math.floor(i / PAGE));
      if (order !== undefined && rows[order]) html = rowHtml(rows[order], i);
      else {
        html = `<div class="tl-row pending grid" style="top:${i * ROW}px"><div class="seq"></div><div class="span">loading…</div></div>`;
        askFor(Math.floor(i / PAGE));
      }
      const had = shown.get(i);
      if (had && had[0] === html) continue;
      const made = document.createElement("template");
      made.innerHTML = html;
      const element = made.content.firstElementChild;
      if (had) had[1].replaceWith(element); else spacer.appendChild(element);
      shown.set(i, [html, element]);
    }
  };
  const repaint = () => { if (!frame) frame = requestAnimationFrame(paint); };
  viewport.addEventListener("scroll", () => {
    repaint();
    if (atBottom()) document.getElementById("jump").classList.remove("show");
  });
  window.addEventListener("resize", repaint);
  const atBottom = () => viewport.scrollTop + viewport.clientHeight >= viewport.scrollHeight - ROW * 1.5;
  document.getElementById("jump").addEventListener("click", () => { viewport.scrollTop = viewport.scrollHeight; });
  spacer.addEventListener("click", (event) => {
    const el = event.target.closest(".tl-row");
    if (!el || el.classList.contains("attempt") || el.classList.contains("pending")) return;
    const row = rows[Number(el.dataset.order)];
    openRow = row.id;
    repaint();
    openEntries(id, row, cluster);
  });

  const showHead = () => {
    if (!summary) return;
    const status = summary.stopped || process || "open";
    const labels = { open: "running or lost", waiting_for_resume: "answered: waits for a resume" };
    document.getElementById("run-status").innerHTML = badge(status, labels[status]);
    // Why nothing moves, and what makes it go on.
    const note = document.getElementById("process-note");
    const notes = {
      lost: "No process runs it: the one that did ended without a last save (killed, or its machine stopped). Run it again to resume; calls it left running are closed as aborted.",
      waiting_for_resume: `Every call it waited on has its answer; nothing runs until it is run again: alpineagents run FILE.yaml --id ${id} (its manifest), or agent.run on the loaded State.`,
    };
    note.hidden = !notes[status];
    note.textContent = notes[status] || "";
    const u = summary.usage;
    const facts = [
      `<span><b>${summary.entries}</b> ${summary.entries === 1 ? "entry" : "entries"}</span>`,
      `<span><b>${summary.turns}</b> turn${summary.turns === 1 ? "" : "s"}</span>`,
      `<span>tokens <b>${tokens(u.input_tokens + (u.cache_creation_input_tokens || 0) + (u.cache_read_input_tokens || 0))}</b> in (<b>${tokens(u.cache_read_input_tokens || 0)}</b> from cache, ${tokens(u.cache_creation_input_tokens || 0)} written) / <b>${tokens(u.output_tokens)}</b> out</span>`,
      ...(summary.cost_usd ? [`<span>about <b>$${summary.cost_usd.toFixed(summary.cost_usd < 1 ? 4 : 2)}</b></span>`] : []),
      `<span><b>${summary.attempts}</b> attempt${summary.attempts > 1 ? "s" : ""}</span>`,
    ];
    if (summary.aborted_calls) facts.push(`<span><b>${summary.aborted_calls}</b> aborted call${summary.aborted_calls > 1 ? "s" : ""}</span>`);
    if (info.parent_id) facts.push(`<span>subagent of <a href="${runUrl(info.parent_id)}">${esc(info.parent_id)}</a></span>`);
    if (cluster) facts.push(`<span>AgentRun <b>${esc(cluster.namespace)}/${esc(cluster.name)}</b> ${badge(cluster.phase || "Pending", cluster.phase || "Pending")} attempt <b>${cluster.attempt}</b>, restarts <b>${cluster.restarts}</b></span>`);
    facts.push(`<span>updated ${esc(age(summary.updated_at))}</span>`);
    document.getElementById("facts").innerHTML = facts.join("");
    const answer = document.getElementById("answer");
    answer.hidden = !summary.answer;
    if (summary.answer) answer.innerHTML = `<span class="label">Answer</span>${esc(summary.answer)}`;
    showApprovals();
    drawPlot();
  };

  const showApprovals = () => {
    const box = document.getElementById("approvals");
    const awaiting = summary.awaiting || [];
    box.hidden = awaiting.length === 0;
    if (!awaiting.length) { box.innerHTML = ""; return; }
    const answering = about.approvals && approvalToken;
    const disabled = answering ? "" : " disabled";
    const why = answering
      ? (awaiting.length > 1 ? "Answer each call; the answers are sent together." : "")
      : about.approvals
        ? "Open the address alpineagents ui printed (it ends in ?token=...) to answer."
        : "Read-only: start the viewer with --allow-approvals to answer.";
    box.innerHTML = `<b>${awaiting.length} call${awaiting.length > 1 ? "s wait" : " waits"} for a person</b> <span class="hint">${esc(why)}</span>` +
      awaiting.map((call) => `
        <div class="approval" data-call="${esc(call.call_id)}">
          <div><span class="mono"><b>${esc(call.name)}</b></span> <span class="hint">${esc(call.call_id)}</span><pre>${esc(JSON.stringify(call.input, null, 2))}</pre></div>
          <div class="buttons"><button type="button" class="allow${chosen[call.call_id] === true ? " chosen" : ""}" data-allow="true"${disabled}>Allow</button><button type="button" class="refuse${chosen[call.call_id] === false ? " chosen" : ""}" data-allow="false"${disabled}>Refuse</button></div>
        </div>`).join("") + `<div class="hint" id="approval-result"></div>`;
  };
  document.getElementById("approvals").addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-allow]");
    if (!button || button.disabled) return;
    const call = button.closest(".approval").dataset.call;
    chosen[call] = button.dataset.allow === "true";
    const awaiting = summary.awaiting.map((c) => c.call_id);
    showApprovals();
    if (!awaiting.every((c) => c in chosen)) return;
    const answers = awaiting.map((c) => ({ call_id: c, allow: chosen[c] }));
    for (const b of document.querySelectorAll("#approvals button")) b.disabled = true;
    try {
      const done = await getJSON(apiUrl(id, "approvals"), {
        method: "POST", headers: { "Content-Type": "application/json", "X-Approval-Token": approvalToken }, body: JSON.stringify({ answers }),
      });
      document.getElementById("approval-result").textContent = `Sent: recorded in ${done.recorded_in}. The run goes on when it is resumed.`;
    } catch (error) {
      chosen = {};
      showApprovals();
      document.getElementById("approval-result").textContent = `Not recorded: ${error.message}`;
    }
  });

  const drawPlot = () => {
    // The server sends the token use so far at each reply, thinned to a plot's worth.
    const kept = summary.usage_over_time || [];
    const plot = document.getElementById("plot");
    if (kept.length < 2) { plot.innerHTML = ""; return; }
    const [, inSum, outSum, cachedSum = 0] = kept[kept.length - 1];
    const t0 = kept[0][0], t1 = Math.max(kept[kept.length - 1][0], t0 + 1);
    const top = Math.max(inSum, outSum, 1);
    const W = 240, H = 54;
    const line = (k) => kept.map((point, i) => `${i ? "L" : "M"}${(((point[0] - t0) / (t1 - t0)) * (W - 6) + 3).toFixed(1)},${(H - 3 - ((point[k + 1] || 0) / top) * (H - 8)).toFixed(1)}`).join("");
    plot.innerHTML = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="token use over time"><path class="in" d="${line(0)}" fill="none" stroke-width="1.6"/><path class="cached" d="${line(2)}" fill="none" stroke-width="1.2" stroke-dasharray="3 2"/><path class="out" d="${line(1)}" fill="none" stroke-width="1.6"/></svg>
      <div class="legend"><span><span class="sw" style="background:var(--accent)"></span>in ${tokens(inSum)}</span><span><span class="sw" style="background:#6a9955"></span>from cache ${tokens(cachedSum)}</span><span><span class="sw" style="background:#d2691e"></span>out ${tokens(outSum)}</span><span>over ${duration(t1 - t0) || "one reply"}</span></div>`;
  };

  const apply = (update) => {
    const stick = atBottom() || update.reset;
    if (update.reset) {
      rows.length = 0; turns.clear(); turnRows.clear(); asked.clear();
      shown.clear(); spacer.textContent = "";
      followId = update.follow_id;
    }
    if (update.about) { about = update.about; showAbout(); }
    if (update.trace_url) Object.assign(document.getElementById("trace-link"), { href: update.trace_url, hidden: false });
    place(update.columns, update.rows);
    summary = update.summary; info = update.info || {}; cluster = update.cluster; process = update.process ?? null;
    if (Object.keys(chosen).some((c) => !summary.awaiting.some((a) => a.call_id === c))) chosen = {};
    showHead();
    showCount();
    if (filtering()) { if (update.reset) view = []; if (update.reset || update.rows.length) refreshSoon(); }
    else if (update.reset) { spacer.style.height = `${total() * ROW}px`; viewport.scrollTop = viewport.scrollHeight; }
    else if (stick && update.rows.length) viewport.scrollTop = viewport.scrollHeight;
    else if (update.rows.length) document.getElementById("jump").classList.add("show");
    paint();
    if (update.gone) document.getElementById("problem").innerHTML = `<div class="problem">This State was deleted from the store.</div>`;
    app.querySelector(".run").dataset.entries = String(summary.entries);
  };

  const showCount = () => {
    const all = summary ? summary.rows : 0;
    document.getElementById("row-count").textContent = filtering()
      ? `${viewTotal} of ${all} rows${viewTotal ? "" : " match"}` : "";
  };
  // The kept rows change as the run goes on: ask again, at most twice a second.
  let refreshTimer = 0;
  const refreshView = () => {
    viewGen++;
    viewAsked.clear();
    askFor(Math.floor(viewport.scrollTop / ROW / PAGE));
    repaint();
  };
  const refreshSoon = () => { if (!refreshTimer) refreshTimer = setTimeout(() => { refreshTimer = 0; refreshView(); }, 500); };
  const setFilter = () => {
    view = [];
    viewTotal = 0;
    showCount();
    if (filtering()) { spacer.style.height = "0px"; viewport.scrollTop = 0; refreshView(); }
    else { spacer.style.height = `${total() * ROW}px`; viewport.scrollTop = viewport.scrollHeight; repaint(); }
  };
  let typing = 0;
  document.getElementById("row-search").addEventListener("input", (event) => {
    const typed = event.target.value;
    clearTimeout(typing);
    // One request when the person stops typing; the filter in force changes only then.
    typing = setTimeout(() => { filter.q = typed; setFilter(); }, 200);
  });
  document.getElementById("errors-only").addEventListener("change", (event) => { filter.errors = event.target.checked; setFilter(); });

  const source = new EventSource(apiUrl(id, "events"));
  source.onmessage = (event) => {
    document.getElementById("problem").innerHTML = "";
    apply(JSON.parse(event.data));
  };
  source.addEventListener("failure", (event) => {
    document.getElementById("problem").innerHTML = `<div class="problem">${esc(JSON.parse(event.data).error)}</div>`;
  });
  source.onerror = async () => {
    if (source.readyState === EventSource.CLOSED || !summary) {
      // The stream was refused (unknown id, unreadable State): say why.
      source.close();
      try { await getJSON(apiUrl(id, "events")); } catch (error) {
        document.getElementById("problem").innerHTML = `<div class="problem">${esc(error.message)}</div>`;
        document.getElementById("facts").textContent = "";
      }
    }
  };
  // Bars of calls still running grow with the clock; repaint the rows in view each second.
  const ticker = setInterval(() => { if (live()) { paint(); } }, 1000);
  const onKey = (event) => { if (event.key === "Escape") closeDetail(); };
  document.addEventListener("keydown", onKey);
  leaveView = () => { source.close(); clearInterval(ticker); clearTimeout(refreshTimer); clearTimeout(typing); document.removeEventListener("keydown", onKey); window.removeEventListener("resize", repaint); };
}

// ------------------------------------------------------------------ an opened row
const detail = document.getElementById("detail");
function closeDetail() {
  detail.hidden = true;
  for (const el of document.querySelectorAll(".tl-row.open")) el.classList.remove("open");
}
document.getElementById("detail-close").addEventListener("click", closeDetail);

// "Fork from here": what to run to fork the run at this entry. The viewer only shows it:
// forking writes a new State, which a read-only page never does.
function forkHint(id, seq, cluster) {
  const laptop = `alpineagents fork ${shellWord(id)} --at ${seq}`;
  const manifest = cluster
    ? `apiVersion: alpineagents.dev/v1\nkind: AgentRun\nmetadata:\n  name: ${cluster.name}-fork-${seq}\n  namespace: ${cluster.namespace}\nspec:\n  model: ...            # the source's, or another\n  forkFrom: {run: ${cluster.name}, entry: ${seq}}`
    : "";
  return `
    <details class="fork" data-seq="${seq}">
      <summary>Fork from here</summary>
      <div class="hint">A new run with entries 0 to ${seq} of this one (this run is left as it is), then:
        <code>alpineagents run FILE.yaml --id ${esc(shellWord(id))}-fork-${seq}</code>. Add <code>--message TEXT</code> or
        <code>--result CALL_ID=TEXT</code> to change its past, and the viewer's <code>--store</code>.</div>
      <pre class="fork-command">${esc(laptop)}</pre>
      ${manifest ? `<div class="hint">On Kubernetes, apply:</div><pre class="fork-manifest">${esc(manifest)}</pre>` : ""}
    </details>`;
}
function shellWord(text) { return /^[\w.@%+=:,/-]+$/.test(text) ? text : `'${text.replace(/'/g, `'\\''`)}'`; }

async function openEntries(id, row, cluster) {
  detail.hidden = false;
  document.getElementById("detail-title").textContent = `${row.kind === "call" ? "tool " : ""}${row.title}${row.seqs.length ? ` · entries ${row.seqs.join(", ")}` : ""}`;
  const body = document.getElementById("detail-body");
  body.innerHTML = `<div class="hint">loading…</div>`;
  try {
    const query = row.seqs.map((s) => `seq=${s}`).join("&");
    const { entries } = await getJSON(`${apiUrl(id, "entries")}?${query}`);
    body.innerHTML = entries.map((e) => `
      <div class="entry">
        <div class="meta"><b>#${e.seq} ${esc(e.kind)}</b> · ${esc(e.time)}${e.data && e.data.outcome ? " · " + badge(e.data.outcome) : ""}</div>
        <pre>${esc(e.text)}</pre>
        <pre>${esc(JSON.stringify(e.data, null, 2))}</pre>
        ${forkHint(id, e.seq, cluster)}
      </div>`).join("") || `<div class="hint">No saved entries.</div>`;
  } catch (error) {
    body.innerHTML = `<div class="problem">${esc(error.message)}</div>`;
  }
}

route();
