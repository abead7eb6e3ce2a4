// raftkv dashboard: vanilla JS over the etcd JSON gateway (/v3/...) and /ui/api/...
// Keys are handled as "binary strings" (one char per byte, what atob/btoa use).
"use strict";

const UI = (window.raftkvUi = {
  stats: { rangeRequests: 0, keysFetched: 0 }, // key-tree reads, counted for tests and people
  samples: 0, // metric samples taken for the charts
  token: sessionStorage.getItem("raftkv-token") || "",
  user: sessionStorage.getItem("raftkv-user") || "",
  config: null,
  isRoot: true,
  readable: null, // [{key, end}] for a non-root user with auth on
});

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") e.textContent = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k === "class") e.className = v;
    else e[k] = v;
  }
  for (const kid of kids) e.append(kid);
  return e;
};
const b64 = (bin) => btoa(bin);
const unb64 = (s) => (s ? atob(s) : "");
const toBytes = (bin) => Uint8Array.from(bin, (c) => c.charCodeAt(0));
const fromText = (text) => String.fromCharCode(...new TextEncoder().encode(text));
const show = (bin) => new TextDecoder("utf-8", { fatal: false }).decode(toBytes(bin));
function prefixEnd(bin) {
  const a = Array.from(bin, (c) => c.charCodeAt(0));
  while (a.length) {
    if (a[a.length - 1] < 0xff) {
      a[a.length - 1] += 1;
      return String.fromCharCode(...a);
    }
    a.pop();
  }
  return "\0";
}
const fmtBytes = (n) =>
  n >= 1 << 30 ? (n / (1 << 30)).toFixed(1) + " GiB" : n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + " MiB" : (n / 1024).toFixed(1) + " KiB";
const fmtTime = (unix) => (unix ? new Date(unix * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "-");

function headers(json = true) {
  const h = json ? { "Content-Type": "application/json" } : {};
  if (UI.token) h.Authorization = UI.token;
  return h;
}
class ApiError extends Error {
  constructor(status, body) {
    super((body && (body.message || body.error)) || "HTTP " + status);
    this.status = status;
  }
}
async function v3(path, body) {
  const resp = await fetch("/v3" + path, { method: "POST", headers: headers(), body: JSON.stringify(body || {}) });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}
async function uiGet(path) {
  const resp = await fetch("/ui/api" + path, { headers: headers(false) });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}
async function uiPost(path, body) {
  const resp = await fetch("/ui/api" + path, { method: "POST", headers: headers(), body: JSON.stringify(body) });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}
async function range(key, end, opts = {}) {
  const body = { key: b64(key), ...opts };
  if (end) body.range_end = b64(end);
  UI.stats.rangeRequests += 1;
  const r = await v3("/kv/range", body);
  UI.stats.keysFetched += (r.kvs || []).length;
  const s = $("#fetch-stats");
  if (s) s.textContent = `${UI.stats.rangeRequests} requests, ${UI.stats.keysFetched} keys`;
  return r;
}

// ---------------------------------------------------------------- login and routing
async function login(ev) {
  ev.preventDefault();
  $("#login-error").textContent = "";
  try {
    const name = $("#login-user").value;
    const r = await v3("/auth/authenticate", { name, password: $("#login-password").value });
    UI.token = r.token;
    UI.user = name;
    sessionStorage.setItem("raftkv-token", r.token);
    sessionStorage.setItem("raftkv-user", name);
    await start();
  } catch (e) {
    $("#login-error").textContent = "login failed: " + e.message;
  }
}
function logout() {
  sessionStorage.removeItem("raftkv-token");
  sessionStorage.removeItem("raftkv-user");
  UI.token = UI.user = "";
  location.hash = "";
  location.reload();
}

async function whoAmI() {
  UI.isRoot = true;
  UI.readable = null;
  if (!UI.config.auth_enabled) return;
  const me = await v3("/auth/user/get", { name: UI.user });
  const roles = me.roles || [];
  UI.isRoot = roles.includes("root");
  if (UI.isRoot) return;
  UI.readable = [];
  for (const role of roles) {
    const r = await v3("/auth/role/get", { role });
    for (const p of r.perm || []) {
      if ((p.permType || "READ") === "WRITE") continue;
      UI.readable.push({ key: unb64(p.key), end: unb64(p.range_end) });
    }
  }
}

const views = {};
let current = null;
function route() {
  const name = (location.hash || "#cluster").slice(1) || "cluster";
  const view = views[name] ? name : "cluster";
  if (view === "auth" && !UI.isRoot) return (location.hash = "#cluster");
  for (const s of document.querySelectorAll("section.view")) s.hidden = s.id !== "view-" + view;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === view);
  if (current && current !== view && views[current].leave) views[current].leave();
  current = view;
  views[view].enter();
}

async function start() {
  UI.config = await uiGet("/config");
  $("#member-name").textContent = `member ${UI.config.member.name} (${UI.config.member.id})`;
  $("#mode").textContent = UI.config.write ? "write enabled" : "read-only";
  if (UI.config.auth_enabled && !UI.token) {
    $("#login").hidden = false;
    $("#nav").hidden = true;
    return;
  }
  try {
    await whoAmI();
  } catch (e) {
    if (UI.config.auth_enabled) return logout();
    throw e;
  }
  $("#login").hidden = true;
  $("#nav").hidden = false;
  $("#logout").hidden = !UI.config.auth_enabled;
  $("#whoami").textContent = UI.config.auth_enabled ? "user " + UI.user : "auth disabled";
  $("#nav-auth").hidden = !(UI.config.auth_enabled ? UI.isRoot : true);
  $("#key-write").hidden = !UI.config.write;
  window.addEventListener("hashchange", route);
  route();
}

// ---------------------------------------------------------------- cluster
const HISTORY_POINTS = 150; // 5 minutes at one sample every 2 s
const series = { writes: [], reads: [], latency: [], fsync: [], pending: [] };
const charts = {};
let lastSample = null;
let clusterTimer = null;

function p99(le, now, before) {
  if (!before || !le.length) return null;
  const delta = now.map((c, i) => c - (before[i] || 0));
  const total = delta[delta.length - 1];
  if (total <= 0) return null;
  const want = total * 0.99;
  for (let i = 0; i < delta.length; i++) {
    if (delta[i] >= want) return le[i] === "+Inf" ? parseFloat(le[i - 1] || "0") * 1000 : parseFloat(le[i]) * 1000;
  }
  return null;
}
function push(name, t, v) {
  const s = series[name];
  s.push([new Date(t * 1000), v]);
  if (s.length > HISTORY_POINTS) s.shift();
  if (typeof Dygraph === "undefined") return;
  const div = $("#chart-" + name);
  if (!charts[name]) {
    charts[name] = new Dygraph(div, s, { labels: ["time", name], legend: "never", strokeWidth: 1.5, drawPoints: false, includeZero: true, axes: { x: { axisLabelWidth: 60 } } });
  } else if (!div.closest("section").hidden) {
    charts[name].updateOptions({ file: s });
  }
}
async function sampleMetrics() {
  const m = await uiGet("/metrics?scope=cluster");
  if (lastSample && lastSample.members.join() !== m.members.join()) lastSample = null; // a member came or went
  if (lastSample) {
    const dt = Math.max(0.001, m.t - lastSample.t);
    push("writes", m.t, Math.max(0, m.revision - lastSample.revision) / dt);
    push("reads", m.t, Math.max(0, m.reads - lastSample.reads) / dt);
    push("latency", m.t, p99(m.latency.le, m.latency.counts, lastSample.latency.counts));
    push("fsync", m.t, p99(m.fsync.le, m.fsync.counts, lastSample.fsync.counts));
  }
  push("pending", m.t, m.proposals_pending);
  lastSample = m;
  UI.samples += 1;
}
function memberRow(m, leaderCommit) {
  const quota = m.quota_backend_bytes || 0;
  const used = m.db_size_bytes || 0;
  const bar = el("span", { class: "bar" }, el("span"));
  bar.firstChild.style.width = quota ? Math.min(100, (100 * used) / quota).toFixed(1) + "%" : "0";
  const health = !m.reachable ? "unreachable" : m.healthy ? "healthy" : "unhealthy";
  const tr = el(
    "tr",
    { "data-member-id": m.id, "data-role": m.reachable ? m.role : "down", class: m.is_leader ? "leader" : m.reachable ? "" : "down" },
    el("td", { text: m.name || "(unstarted)" }),
    el("td", { text: m.id }),
    el("td", { class: "role", text: m.is_leader ? "leader" : m.reachable ? m.role : "down" }),
    el("td", { text: m.reachable ? m.term : "-" }),
    el("td", { text: m.reachable ? m.commit_index : "-" }),
    el("td", { text: m.reachable ? m.applied_index : "-" }),
    el("td", { text: m.match ?? "-" }),
    el("td", { text: m.lag ?? "-" }),
    el("td", { class: "health", text: health, title: m.error || "" }),
    el("td", {}, m.reachable ? `${fmtBytes(used)} / ${quota ? fmtBytes(quota) : "?"} ` : "-", bar),
    el("td", { text: (m.alarms || []).join(" ") || "none" }),
    el("td", { text: m.reachable ? m.leader_changes : "-" }),
    el("td")
  );
  if (UI.config.write && m.reachable && !m.is_leader && m.role !== "learner") {
    const b = el("button", { text: "make leader", class: "move-leader" });
    b.onclick = async () => {
      b.disabled = true;
      try {
        await uiPost("/move-leader", { to: m.id });
      } catch (e) {
        $("#cluster-error").textContent = "move leader: " + e.message;
      }
      refreshCluster();
    };
    tr.lastChild.append(b);
  }
  return tr;
}
async function refreshCluster() {
  try {
    const c = await uiGet("/cluster");
    const leader = c.members.find((m) => m.is_leader);
    $("#leader-name").textContent = leader ? `${leader.name} (${leader.id})` : "none";
    $("#cluster-term").textContent = c.term;
    const tbody = $("#members tbody");
    tbody.replaceChildren(...c.members.map((m) => memberRow(m)));
    $("#cluster-error").textContent = "";
  } catch (e) {
    $("#cluster-error").textContent = "cluster: " + e.message;
  }
  try {
    await sampleMetrics();
  } catch (e) {
    /* charts skip a sample */
  }
}
views.cluster = {
  enter() {
    refreshCluster();
    clusterTimer = setInterval(refreshCluster, 2000);
  },
  leave() {
    clearInterval(clusterTimer);
  },
};

// ---------------------------------------------------------------- keys
const CHILDREN_PAGE = 100;
let watchAbort = null;
let selectedKey = null;

function sepChar() {
  return fromText($("#sep").value || "/");
}

// One level under `prefix`: each request is a keys_only range with a small limit; a
// sub-"directory" is skipped in one jump (the next request starts at its range end), so a
// level costs about one request per child, never the keys below it.
async function listChildren(prefix, startKey, maxChildren) {
  const sep = sepChar();
  const end = prefix ? prefixEnd(prefix) : "\0";
  let start = startKey || (prefix || "\0");
  let limit = 16;
  const children = [];
  for (;;) {
    const r = await range(start, end, { keys_only: true, limit });
    const kvs = r.kvs || [];
    if (!kvs.length) return { children, next: null };
    let added = 0;
    let full = false;
    for (const kv of kvs) {
      const key = unb64(kv.key);
      const rest = key.slice(prefix.length);
      const i = rest.indexOf(sep);
      const name = i < 0 ? rest : rest.slice(0, i + sep.length);
      const last = children[children.length - 1];
      if (last && last.name === name) continue;
      if (children.length >= maxChildren) {
        full = true;
        break;
      }
      children.push({ name, dir: i >= 0, key: prefix + name });
      added += 1;
    }
    const last = children[children.length - 1];
    const next = last.dir ? prefixEnd(last.key) : last.key + "\0";
    if (full) return { children, next: next };
    if (!r.more) return { children, next: null };
    if (end !== "\0" && next >= end) return { children, next: null };
    if (children.length >= maxChildren) return { children, next };
    start = next;
    // Pages that hit one sub-directory shrink (down to one key per request); pages of
    // distinct children grow.
    limit = added <= 2 ? Math.max(1, limit >> 2) : added === kvs.length ? Math.min(256, limit * 2) : limit;
  }
}

function treeItem(child) {
  const li = el("li", { class: child.dir ? "dir" : "leaf", "data-key": b64(child.key) });
  const label = el("span", { text: show(child.name) || "(empty)" });
  li.append(label);
  label.onclick = () => (child.dir ? toggleDir(li, child.key) : selectKey(li, child.key));
  return li;
}
async function fillLevel(ul, prefix, startKey) {
  const { children, next } = await listChildren(prefix, startKey, CHILDREN_PAGE);
  for (const c of children) ul.append(treeItem(c));
  if (next) {
    const more = el("li", { class: "more" }, el("span", { text: "more…" }));
    more.firstChild.onclick = async () => {
      more.remove();
      await fillLevel(ul, prefix, next);
    };
    ul.append(more);
  }
  ul.dataset.loaded = "1";
}
async function toggleDir(li, prefix) {
  const open = li.classList.toggle("open");
  let ul = li.querySelector(":scope > ul");
  if (!open) {
    if (ul) ul.hidden = true;
    return;
  }
  if (!ul) {
    ul = el("ul");
    li.append(ul);
    try {
      await fillLevel(ul, prefix, null);
    } catch (e) {
      ul.append(el("li", { class: "error", text: e.message }));
    }
  }
  ul.hidden = false;
  startWatch(prefix);
}

function hex(bin) {
  return Array.from(toBytes(bin), (b) => b.toString(16).padStart(2, "0")).join(" ");
}
function render(bin, mode) {
  if (mode === "hex") return hex(bin);
  const text = show(bin);
  if (mode === "json") {
    try {
      return JSON.stringify(JSON.parse(text), null, 2);
    } catch (e) {
      return text;
    }
  }
  return text;
}
function lineDiff(a, b) {
  const x = a.split("\n");
  const y = b.split("\n");
  if (x.length * y.length > 250000) return [["=", "(values too large to compare line by line)"]];
  const dp = Array.from({ length: x.length + 1 }, () => new Array(y.length + 1).fill(0));
  for (let i = x.length - 1; i >= 0; i--)
    for (let j = y.length - 1; j >= 0; j--) dp[i][j] = x[i] === y[j] ? dp[i + 1][j + 1] + 1 : Math.max(dp[i + 1][j], dp[i][j + 1]);
  const out = [];
  let i = 0;
  let j = 0;
  while (i < x.length && j < y.length) {
    if (x[i] === y[j]) out.push(["=", x[i++]]), j++;
    else if (dp[i + 1][j] >= dp[i][j + 1]) out.push(["-", x[i++]]);
    else out.push(["+", y[j++]]);
  }
  while (i < x.length) out.push(["-", x[i++]]);
  while (j < y.length) out.push(["+", y[j++]]);
  return out;
}

async function selectKey(li, key) {
  for (const s of document.querySelectorAll("#tree li.selected")) s.classList.remove("selected");
  if (li) li.classList.add("selected");
  selectedKey = key;
  const pane = $("#key-detail");
  pane.replaceChildren(el("p", { class: "muted", text: "loading…" }));
  try {
    const [cur, hist] = await Promise.all([range(key, "", {}), uiGet("/history?key=" + encodeURIComponent(b64(key)))]);
    if (selectedKey !== key) return;
    const kv = (cur.kvs || [])[0];
    const mode = el("select", { id: "value-mode" }, el("option", { value: "text", text: "text" }), el("option", { value: "json", text: "JSON" }), el("option", { value: "hex", text: "hex" }));
    const value = el("pre", { class: "value", id: "value" });
    const paint = () => (value.textContent = kv ? render(unb64(kv.value), mode.value) : "(deleted)");
    mode.onchange = paint;
    if (kv && /^\s*[[{]/.test(show(unb64(kv.value)))) mode.value = "json";
    paint();
    const meta = kv
      ? `version ${kv.version || 1}, created at revision ${kv.create_revision}, modified at ${kv.mod_revision}, lease ${kv.lease && kv.lease !== "0" ? BigInt(kv.lease).toString(16) : "none"}`
      : "no current version";
    const rows = hist.versions.map((v, i) =>
      el(
        "tr",
        { "data-revision": v.mod_revision, "data-type": v.type },
        el("td", {}, el("input", { type: "radio", name: "diff-a", value: i })),
        el("td", {}, el("input", { type: "radio", name: "diff-b", value: i })),
        el("td", { text: v.mod_revision }),
        el("td", { text: v.type }),
        el("td", { text: v.type === "PUT" ? v.version : "" }),
        el("td", { text: v.type === "PUT" ? show(unb64(v.value)).slice(0, 80) : "" })
      )
    );
    const table = el("table", { id: "history" }, el("thead", {}, el("tr", {}, ...["A", "B", "revision", "event", "version", "value"].map((t) => el("th", { text: t })))), el("tbody", {}, ...rows));
    const diff = el("pre", { class: "value", id: "diff" });
    const compare = () => {
      const a = table.querySelector("input[name=diff-a]:checked");
      const b = table.querySelector("input[name=diff-b]:checked");
      if (!a || !b) return;
      const va = hist.versions[a.value];
      const vb = hist.versions[b.value];
      const ta = va.type === "PUT" ? render(unb64(va.value), mode.value) : "";
      const tb = vb.type === "PUT" ? render(unb64(vb.value), mode.value) : "";
      diff.replaceChildren(...lineDiff(ta, tb).map(([op, line]) => el("div", { class: op === "+" ? "diff-add" : op === "-" ? "diff-del" : "", text: `${op === "=" ? " " : op} ${line}` })));
    };
    table.onchange = compare;
    // By default, the change made by the newest put: the last two versions with a value.
    const puts = hist.versions.map((v, i) => (v.type === "PUT" ? i : -1)).filter((i) => i >= 0);
    if (puts.length >= 2) {
      rows[puts[puts.length - 2]].querySelector("input[name=diff-a]").checked = true;
      rows[puts[puts.length - 1]].querySelector("input[name=diff-b]").checked = true;
      compare();
    }
    const parts = [
      el("h3", { id: "key-name", text: show(key) }),
      el("p", {}, meta, " — show as ", mode),
      value,
      el("h4", { text: `History (compact revision ${hist.compact_revision > 0 ? hist.compact_revision : "none: never compacted"}, store revision ${hist.revision}${hist.truncated ? ", oldest versions left out" : ""})` }),
      table,
      el("h4", { text: "Change between A and B" }),
      diff,
    ];
    if (UI.config.write && kv) {
      const del = el("button", { id: "delete-key", text: "delete this key" });
      del.onclick = async () => {
        await uiPost("/kv/delete", { key: b64(key) });
        selectKey(li, key);
      };
      parts.splice(2, 0, del);
    }
    pane.replaceChildren(...parts);
  } catch (e) {
    pane.replaceChildren(el("p", { class: "error", text: e.message }));
  }
}

// A live tail of the prefix in view: the gateway's watch stream, read as it arrives.
async function startWatch(prefix) {
  if (watchAbort) watchAbort.abort();
  const ctl = (watchAbort = new AbortController());
  const log = $("#watch-log");
  log.replaceChildren();
  $("#watch-prefix").textContent = prefix ? show(prefix) : "(all keys)";
  const body = { create_request: { key: b64(prefix || "\0"), range_end: b64(prefix ? prefixEnd(prefix) : "\0") } };
  try {
    const resp = await fetch("/v3/watch", { method: "POST", headers: headers(), body: JSON.stringify(body), signal: ctl.signal });
    if (!resp.ok || !resp.body) return;
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line) continue;
        const msg = JSON.parse(line);
        for (const ev of (msg.result && msg.result.events) || []) {
          const k = show(unb64(ev.kv.key));
          const text = `${ev.kv.mod_revision} ${ev.type || "PUT"} ${k}` + (ev.type === "DELETE" ? "" : ` = ${show(unb64(ev.kv.value || "")).slice(0, 60)}`);
          log.prepend(el("li", { text }));
          while (log.children.length > 200) log.lastChild.remove();
        }
      }
    }
  } catch (e) {
    /* aborted when the view changes */
  }
}

views.keys = {
  async enter() {
    const tree = $("#tree");
    if (tree.dataset.loaded) return;
    tree.dataset.loaded = "1";
    try {
      if (UI.readable) {
        for (const p of UI.readable) {
          const isPrefix = p.end && p.end === prefixEnd(p.key);
          tree.append(treeItem({ name: p.key, dir: !!isPrefix, key: p.key }));
        }
        if (UI.readable.length === 1) startWatch(UI.readable[0].key);
      } else {
        await fillLevel(tree, "", null);
        startWatch("");
      }
    } catch (e) {
      tree.append(el("li", { class: "error", text: e.message }));
    }
  },
  leave() {
    if (watchAbort) watchAbort.abort();
    $("#tree").dataset.loaded = "";
    $("#tree").replaceChildren();
  },
};

// ---------------------------------------------------------------- leases
let leaseTimers = [];
views.leases = {
  async enter() {
    const tick = async () => {
      const tbody = $("#leases tbody");
      try {
        const r = await v3("/lease/leases", {});
        const ids = (r.leases || []).slice(0, 100).map((l) => l.ID);
        const rows = [];
        for (const id of ids) {
          const t = await v3("/lease/timetolive", { ID: id, keys: true });
          const deadline = Date.now() + Number(t.TTL || 0) * 1000;
          const ttl = el("td", { class: "ttl", "data-deadline": deadline, text: (t.TTL || 0) + " s" });
          const keys = (t.keys || []).map((k) => show(unb64(k)));
          rows.push(el("tr", { "data-lease": BigInt(id).toString(16) }, el("td", { text: BigInt(id).toString(16) }), ttl, el("td", { text: t.grantedTTL + " s" }), el("td", { text: keys.join(", ") || "none" })));
        }
        tbody.replaceChildren(...rows);
        $("#leases-error").textContent = "";
      } catch (e) {
        $("#leases-error").textContent = "leases: " + e.message;
      }
    };
    await tick();
    leaseTimers.push(setInterval(tick, 5000));
    leaseTimers.push(
      setInterval(() => {
        for (const td of document.querySelectorAll("#leases td.ttl")) {
          td.textContent = Math.max(0, Math.round((Number(td.dataset.deadline) - Date.now()) / 1000)) + " s";
        }
      }, 1000)
    );
  },
  leave() {
    leaseTimers.forEach(clearInterval);
    leaseTimers = [];
  },
};

// ---------------------------------------------------------------- pipelines
let pipelineTimer = null;
function denied(section) {
  return section.denied ? `(you may not read ${section.prefix})` : "";
}
async function refreshPipelines() {
  try {
    const p = await uiGet("/pipelines");
    const locks = p.locks.items || [];
    $("#locks tbody").replaceChildren(
      ...locks.map((l) =>
        el("tr", { "data-lock": l.name, "data-token": l.token }, el("td", { text: l.name }), el("td", { text: l.holder }), el("td", { class: "token", text: l.token }), el("td", { text: l.lease }), el("td", { text: l.waiters.map((w) => `${w.key} (rev ${w.create_revision})`).join(", ") || "none" }))
      )
    );
    const logs = $("#commitlogs");
    logs.replaceChildren(
      ...(p.commitlogs.items || []).map((t) =>
        el(
          "div",
          { "data-table": t.table },
          el("h4", { text: `${t.table}: ${t.versions_seen} version(s)` }),
          el(
            "table",
            {},
            el("thead", {}, el("tr", {}, ...["version", "revision", "committer", "time", "fence", "payload"].map((h) => el("th", { text: h })))),
            el("tbody", {}, ...t.latest.map((v) => el("tr", {}, el("td", { text: v.version }), el("td", { text: v.revision }), el("td", { text: v.committer ?? "-" }), el("td", { text: typeof v.time === "number" ? fmtTime(v.time) : v.time ?? "-" }), el("td", { text: v.fence ?? "-" }), el("td", { text: v.payload }))))
          )
        )
      )
    );
    if (!logs.children.length) logs.append(el("p", { class: "muted", text: denied(p.commitlogs) || "no commit logs" }));
    $("#batches tbody").replaceChildren(
      ...(p.batches.items || []).map((b) => el("tr", { "data-query": b.name }, el("td", { text: b.name }), el("td", { text: b.batches }), el("td", { text: b.last_batch_id }), el("td", { text: fmtTime(b.last_finished_unix) }), el("td", { text: b.revision })))
    );
    $("#pipelines-error").textContent = [denied(p.locks), denied(p.batches)].filter(Boolean).join(" ");
  } catch (e) {
    $("#pipelines-error").textContent = "pipelines: " + e.message;
  }
}
views.pipelines = {
  enter() {
    refreshPipelines();
    pipelineTimer = setInterval(refreshPipelines, 2000);
  },
  leave() {
    clearInterval(pipelineTimer);
  },
};

// ---------------------------------------------------------------- archive
views.archive = {
  async enter() {
    const div = $("#archive");
    try {
      const a = await uiGet("/archive");
      if (!a.enabled) return div.replaceChildren(el("p", { text: "This member does not archive (start it with --archive-url)." }));
      const r = a.restorable || {};
      const rows = [
        ["lag", `${a.lag_entries} entries, ${a.lag_seconds} s`],
        ["last upload", fmtTime(a.last_upload_unix)],
        ["uploaded", fmtBytes(a.uploaded_bytes || 0)],
        ["snapshots / WAL segments", `${a.snapshots ?? "-"} / ${a.segments ?? "-"}`],
        ["restorable from", `index ${r.from_index ?? "-"} (revision ${r.from_revision ?? "-"}), ${fmtTime(r.from_unix)}`],
        ["restorable to", `index ${r.to_index ?? "-"}, ${fmtTime(r.to_unix)}`],
        ["errors", `${a.errors}${a.last_error ? " — " + a.last_error : ""}`],
      ];
      div.replaceChildren(el("table", {}, el("tbody", {}, ...rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: v }))))));
    } catch (e) {
      div.replaceChildren(el("p", { class: "error", text: e.message }));
    }
  },
};

// ---------------------------------------------------------------- auth (root only)
function permText(p) {
  const key = unb64(p.key);
  const end = unb64(p.range_end);
  const what = !end ? show(key) : end === prefixEnd(key) ? show(key) + "*" : `[${show(key)}, ${show(end)})`;
  return `${p.permType || "READ"} ${what}`;
}
views.auth = {
  async enter() {
    if (!UI.config.auth_enabled) {
      $("#auth-info").textContent = "Authentication is disabled on this cluster.";
    }
    try {
      const users = (await v3("/auth/user/list", {})).users || [];
      const urows = [];
      for (const u of users) urows.push(el("tr", { "data-user": u }, el("td", { text: u }), el("td", { text: ((await v3("/auth/user/get", { name: u })).roles || []).join(", ") })));
      $("#users tbody").replaceChildren(...urows);
      const roles = (await v3("/auth/role/list", {})).roles || [];
      const rrows = [];
      for (const r of roles) rrows.push(el("tr", { "data-role": r }, el("td", { text: r }), el("td", { text: ((await v3("/auth/role/get", { role: r })).perm || []).map(permText).join("; ") || "none" })));
      $("#roles tbody").replaceChildren(...rrows);
    } catch (e) {
      $("#auth-info").textContent = e.message;
    }
  },
};

// ---------------------------------------------------------------- start
$("#login-form").addEventListener("submit", login);
$("#logout").onclick = logout;
$("#put-submit").onclick = async () => {
  try {
    const r = await uiPost("/kv/put", { key: b64(fromText($("#put-key").value)), value: b64(fromText($("#put-value").value)) });
    $("#put-result").textContent = "revision " + r.revision;
  } catch (e) {
    $("#put-result").textContent = e.message;
  }
};
$("#sep").onchange = () => {
  views.keys.leave();
  views.keys.enter();
};
start().catch((e) => {
  document.body.prepend(el("p", { class: "error", text: "dashboard failed to start: " + e.message }));
});
