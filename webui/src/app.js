// Promptly's chat UI. It speaks only the public OpenAI API (/v1/models, streaming
// /v1/chat/completions) plus the Prometheus text of /metrics, so it works against any server that
// offers those; conversations live in the browser's localStorage, never on the server.
import { Marked } from 'marked';
import hljs from 'highlight.js/lib/core';
import bash from 'highlight.js/lib/languages/bash';
import cpp from 'highlight.js/lib/languages/cpp';
import javascript from 'highlight.js/lib/languages/javascript';
import json from 'highlight.js/lib/languages/json';
import python from 'highlight.js/lib/languages/python';
import rust from 'highlight.js/lib/languages/rust';
import typescript from 'highlight.js/lib/languages/typescript';

for (const [name, language] of Object.entries({ bash, cpp, javascript, json, python, rust, typescript })) {
  hljs.registerLanguage(name, language);
}

const STORAGE_CONVERSATIONS = 'promptly.conversations';
const STORAGE_SETTINGS = 'promptly.settings';
const STORAGE_THEME = 'promptly.theme';
const DEFAULT_SETTINGS = { system: '', temperature: 0.7, top_p: 0.95, max_tokens: 512, api_key: '' };

const $ = (id) => document.getElementById(id);
// The /v1 routes need the key when the server runs with --api-key; the page itself does not.
const authHeaders = () => (state.settings.api_key ? { Authorization: `Bearer ${state.settings.api_key}` } : {});
const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);

// Model output is untrusted: raw HTML is shown as text, and links keep only web and mail schemes,
// so a reply cannot run script in this page.
const markdown = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    html({ text }) {
      return escapeHtml(text);
    },
    link({ href, tokens }) {
      const text = this.parser.parseInline(tokens);
      if (!/^(https?:|mailto:)/i.test(href)) return text;
      return `<a href="${escapeHtml(href)}" target="_blank" rel="noopener noreferrer">${text}</a>`;
    },
    image({ text }) {
      return escapeHtml(text);  // no remote fetches from model output
    },
    code({ text, lang }) {
      const language = (lang || '').split(/\s/)[0].toLowerCase();
      const body = hljs.getLanguage(language) ? hljs.highlight(text, { language, ignoreIllegals: true }).value : escapeHtml(text);
      return `<pre><button class="copy" type="button">Copy</button><code class="hljs">${body}</code></pre>`;
    },
  },
});

function load(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;  // storage from an older or broken version: start clean rather than fail
  }
}

function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (e) {
    console.warn('could not save to localStorage', e);
  }
}

const state = {
  conversations: load(STORAGE_CONVERSATIONS, []),
  activeId: null,
  settings: { ...DEFAULT_SETTINGS, ...load(STORAGE_SETTINGS, {}) },
  model: null,
  generation: null,  // { controller, conversationId } while a reply streams
};
if (!Array.isArray(state.conversations)) state.conversations = [];

function activeConversation() {
  return state.conversations.find((c) => c.id === state.activeId) ?? null;
}

function saveConversations() {
  save(STORAGE_CONVERSATIONS, state.conversations);
}

function newConversation() {
  const conversation = { id: `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`, title: 'New chat', messages: [], updated: Date.now() };
  state.conversations.unshift(conversation);
  state.activeId = conversation.id;
  return conversation;
}

// --- rendering ---

function renderSidebar() {
  const nav = $('conversations');
  nav.replaceChildren();
  for (const c of [...state.conversations].sort((a, b) => b.updated - a.updated)) {
    const row = document.createElement('div');
    row.className = 'conversation' + (c.id === state.activeId ? ' active' : '');
    row.dataset.id = c.id;
    const title = document.createElement('button');
    title.className = 'title';
    title.type = 'button';
    title.textContent = c.title;
    title.title = c.title;
    title.onclick = () => {
      if (state.generation) return;
      state.activeId = c.id;
      render();
    };
    const remove = document.createElement('button');
    remove.className = 'delete';
    remove.type = 'button';
    remove.textContent = '×';
    remove.title = 'Delete this conversation';
    remove.onclick = () => {
      if (state.generation?.conversationId === c.id) state.generation.controller.abort();
      state.conversations = state.conversations.filter((x) => x.id !== c.id);
      if (state.activeId === c.id) state.activeId = state.conversations[0]?.id ?? null;
      saveConversations();
      render();
    };
    row.append(title, remove);
    nav.append(row);
  }
}

function statsText(stats) {
  if (!stats) return '';
  const parts = [];
  if (stats.ttft_ms != null) parts.push(`TTFT ${Math.round(stats.ttft_ms)} ms`);
  if (stats.tokens != null) parts.push(`${stats.tokens} tokens`);
  if (stats.tokens_per_s != null) parts.push(`${stats.tokens_per_s.toFixed(1)} tokens/s`);
  if (stats.finish_reason) parts.push(stats.finish_reason);
  return parts.join(' · ');
}

function renderMessage(conversation, message, index) {
  const el = document.createElement('div');
  el.className = `message ${message.role}`;
  el.dataset.index = index;
  const bubble = document.createElement('div');
  bubble.className = 'bubble';
  const content = document.createElement('div');
  content.className = 'content';
  if (message.role === 'assistant') content.innerHTML = markdown.parse(message.content || '');
  else content.textContent = message.content;
  bubble.append(content);
  const meta = document.createElement('div');
  meta.className = 'meta';
  const stats = document.createElement('span');
  stats.className = 'stats';
  stats.textContent = statsText(message.stats);
  if (message.error) {
    const error = document.createElement('span');
    error.className = 'error';
    error.textContent = message.error;
    meta.append(error);
  }
  meta.append(stats);
  const last = index === conversation.messages.length - 1;
  if (!state.generation) {
    if (message.role === 'user') meta.append(button('Edit', 'edit', () => startEdit(el, conversation, index)));
    if (message.role === 'assistant' && last) meta.append(button('Regenerate', 'regenerate', () => regenerate(conversation)));
  }
  el.append(bubble, meta);
  return el;
}

function button(label, className, onclick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = className;
  b.textContent = label;
  b.onclick = onclick;
  return b;
}

function render() {
  renderSidebar();
  const conversation = activeConversation();
  const list = $('messages');
  list.replaceChildren();
  if (conversation) conversation.messages.forEach((m, i) => list.append(renderMessage(conversation, m, i)));
  list.scrollTop = list.scrollHeight;
  const busy = Boolean(state.generation);
  $('send').hidden = busy;
  $('stop').hidden = !busy;
}

function startEdit(el, conversation, index) {
  const bubble = el.querySelector('.bubble');
  const editor = document.createElement('textarea');
  editor.value = conversation.messages[index].content;
  editor.rows = Math.min(12, editor.value.split('\n').length + 1);
  el.classList.add('editing');
  bubble.replaceChildren(editor);
  const meta = el.querySelector('.meta');
  meta.replaceChildren(
    button('Send', 'resend', () => {
      const text = editor.value.trim();
      if (!text) return;
      // Editing rewrites history from this message on: the later turns answered the old text.
      conversation.messages = conversation.messages.slice(0, index);
      conversation.messages.push({ role: 'user', content: text });
      generate(conversation);
    }),
    button('Cancel', 'cancel', render),
  );
  editor.focus();
}

// --- generation ---

function requestMessages(conversation) {
  const messages = [];
  if (state.settings.system.trim()) messages.push({ role: 'system', content: state.settings.system });
  for (const m of conversation.messages) messages.push({ role: m.role, content: m.content });
  return messages;
}

function numberSetting(value, fallback) {
  const n = Number(value);
  return Number.isFinite(n) ? n : fallback;
}

// Reads server-sent events off the response body, calling onData with each event's parsed JSON.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
      if (!data || data === '[DONE]') continue;
      onData(JSON.parse(data));
    }
  }
}

async function generate(conversation) {
  if (conversation.messages.length === 1 || conversation.title === 'New chat') {
    const first = conversation.messages.find((m) => m.role === 'user');
    if (first) conversation.title = first.content.slice(0, 60);
  }
  const reply = { role: 'assistant', content: '', stats: null };
  conversation.messages.push(reply);
  conversation.updated = Date.now();
  const controller = new AbortController();
  state.generation = { controller, conversationId: conversation.id };
  saveConversations();
  render();

  const s = state.settings;
  const body = {
    messages: requestMessages(conversation).slice(0, -1),
    stream: true,
    stream_options: { include_usage: true },
    temperature: numberSetting(s.temperature, DEFAULT_SETTINGS.temperature),
    top_p: numberSetting(s.top_p, DEFAULT_SETTINGS.top_p),
    max_tokens: Math.max(1, Math.round(numberSetting(s.max_tokens, DEFAULT_SETTINGS.max_tokens))),
  };
  if (state.model) body.model = state.model;
  const started = performance.now();
  let firstToken = null;
  let pieces = 0;
  let usage = null;
  let finishReason = null;
  let repaint = 0;
  const repaintReply = () => {
    repaint = 0;
    if (state.activeId !== conversation.id) return;
    const el = $('messages').lastElementChild?.querySelector('.content');
    if (!el) return;
    el.innerHTML = markdown.parse(reply.content);
    const list = $('messages');
    list.scrollTop = list.scrollHeight;
  };
  try {
    const response = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', ...authHeaders() },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      const text = await response.text();
      let message = text;
      try {
        message = JSON.parse(text).error?.message ?? text;
      } catch {
        // not JSON: show the text as it came
      }
      throw new Error(`${response.status}: ${message}`);
    }
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message ?? 'generation failed');
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) return;
      if (choice.finish_reason) finishReason = choice.finish_reason;
      const text = choice.delta?.content;
      if (text) {
        if (firstToken === null) firstToken = performance.now();
        pieces += 1;
        reply.content += text;
        if (!repaint) repaint = requestAnimationFrame(repaintReply);
      }
    });
  } catch (e) {
    if (controller.signal.aborted) finishReason = 'stopped';
    else reply.error = e.message;
  } finally {
    if (repaint) cancelAnimationFrame(repaint);
    const ended = performance.now();
    const tokens = usage?.completion_tokens ?? pieces;
    const decodeSeconds = firstToken !== null ? (ended - firstToken) / 1000 : 0;
    reply.stats = {
      ttft_ms: firstToken !== null ? firstToken - started : null,
      tokens,
      // The first token's time is TTFT's; the rate counts the tokens after it.
      tokens_per_s: tokens > 1 && decodeSeconds > 0 ? (tokens - 1) / decodeSeconds : null,
      finish_reason: finishReason,
    };
    conversation.updated = Date.now();
    state.generation = null;
    saveConversations();
    render();
    $('prompt').focus();
  }
}

function regenerate(conversation) {
  if (state.generation) return;
  while (conversation.messages.length && conversation.messages.at(-1).role === 'assistant') conversation.messages.pop();
  if (conversation.messages.length) generate(conversation);
}

function send(event) {
  event.preventDefault();
  if (state.generation) return;
  const prompt = $('prompt');
  const text = prompt.value.trim();
  if (!text) return;
  prompt.value = '';
  const conversation = activeConversation() ?? newConversation();
  conversation.messages.push({ role: 'user', content: text });
  generate(conversation);
}

// --- status panel: a few of the server's Prometheus metrics ---

function parseMetrics(text) {
  const values = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const space = line.lastIndexOf(' ');
    values.set(line.slice(0, space), Number(line.slice(space + 1)));
  }
  return values;
}

let previousSample = null;

async function pollStatus() {
  try {
    const response = await fetch('/metrics', { cache: 'no-store' });
    if (!response.ok) throw new Error(String(response.status));
    const m = parseMetrics(await response.text());
    const get = (name) => m.get(`promptly:${name}`);
    const show = (id, value) => {
      $(id).textContent = value;
    };
    show('status-running', get('num_requests_running') ?? '-');
    show('status-waiting', get('num_requests_waiting') ?? '-');
    const kv = get('kv_cache_usage_perc');
    show('status-kv', kv == null ? '-' : `${(kv * 100).toFixed(1)} %`);
    const busy = get('engine_busy_ratio');
    show('status-busy', busy == null ? '-' : `${(busy * 100).toFixed(0)} %`);
    const sample = { at: performance.now(), tokens: get('engine_generated_tokens_total') };
    if (previousSample && sample.tokens != null && previousSample.tokens != null) {
      const seconds = (sample.at - previousSample.at) / 1000;
      show('status-tps', seconds > 0 ? ((sample.tokens - previousSample.tokens) / seconds).toFixed(1) : '-');
    }
    previousSample = sample;
  } catch {
    $('status-running').textContent = 'offline';
  }
}

async function loadModel() {
  try {
    const response = await fetch('/v1/models', { headers: authHeaders() });
    const list = await response.json();
    state.model = list.data?.[0]?.id ?? null;
    if (state.model) $('model-name').textContent = state.model;
  } catch {
    // The chat still works without a model name: the server picks its only model.
  }
}

// --- settings and theme ---

function bindSettings() {
  const fields = { 'system-prompt': 'system', temperature: 'temperature', 'top-p': 'top_p', 'max-tokens': 'max_tokens', 'api-key': 'api_key' };
  for (const [id, key] of Object.entries(fields)) {
    const input = $(id);
    input.value = state.settings[key];
    input.addEventListener('input', () => {
      state.settings[key] = key === 'system' || key === 'api_key' ? input.value : Number(input.value);
      save(STORAGE_SETTINGS, state.settings);
      if (key === 'api_key') loadModel();
    });
  }
  $('toggle-settings').onclick = () => {
    const panel = $('settings');
    panel.hidden = !panel.hidden;
    $('toggle-settings').setAttribute('aria-expanded', String(!panel.hidden));
  };
}

function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  $('toggle-theme').textContent = theme === 'dark' ? 'Light' : 'Dark';
}

function bindTheme() {
  const preferred = window.matchMedia?.('(prefers-color-scheme: dark)').matches ? 'dark' : 'light';
  let theme = load(STORAGE_THEME, preferred);
  applyTheme(theme);
  $('toggle-theme').onclick = () => {
    theme = theme === 'dark' ? 'light' : 'dark';
    save(STORAGE_THEME, theme);
    applyTheme(theme);
  };
}

function bindComposer() {
  $('composer').addEventListener('submit', send);
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) send(e);
  });
  $('stop').onclick = () => state.generation?.controller.abort();
  $('new-chat').onclick = () => {
    if (state.generation) return;
    newConversation();
    render();
    $('prompt').focus();
  };
  // One listener for every code block's copy button, including those of replies still streaming.
  $('messages').addEventListener('click', async (e) => {
    const copy = e.target.closest('pre .copy');
    if (!copy) return;
    const code = copy.parentElement.querySelector('code').textContent;
    try {
      await navigator.clipboard.writeText(code);
      copy.textContent = 'Copied';
    } catch {
      copy.textContent = 'Copy failed';
    }
    setTimeout(() => (copy.textContent = 'Copy'), 1500);
  });
}

state.activeId = [...state.conversations].sort((a, b) => b.updated - a.updated)[0]?.id ?? null;
// A reply cut off by closing the tab was saved while streaming: say so rather than show it as whole.
for (const c of state.conversations) {
  for (const m of c.messages ?? []) {
    if (m.role === 'assistant' && !m.stats && !m.error) m.stats = { finish_reason: 'interrupted' };
  }
}
bindTheme();
bindSettings();
bindComposer();
render();
loadModel();
pollStatus();
setInterval(pollStatus, 2000);
