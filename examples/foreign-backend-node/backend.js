#!/usr/bin/env node
// An example kvconform foreign backend (specs/FOREIGN_BACKEND.md) in plain
// Node.js: vLLM 0.32's KV cache manager for one full-attention or sliding-window
// group, or a hybrid of the two with equal block sizes, with prefix caching, the free queue's eviction order, sha256 / sha256_cbor block
// hashes (NONE_HASH as 0.32 derives it), LoRA and cache-salt extra keys, KV
// events and prefix-cache stats. No npm packages.
//
// KVCONFORM_NODE_BUG=eviction-order frees a request's blocks head first
// instead of tail first: a negative control the gate must catch.
'use strict';
const crypto = require('crypto');
const readline = require('readline');

const BUG = process.env.KVCONFORM_NODE_BUG || '';
const OPS = ['add_request', 'lookup', 'truncate_computed_blocks', 'allocate', 'append_tokens',
  'cache_blocks', 'free',
  'preempt', 'record_stats', 'reset_prefix_cache', 'evict_blocks', 'step',
  'take_block_copies', 'checkpoint'];
const HELLO = {
  kvconform_foreign_backend: 1,
  name: 'node-example',
  capabilities: {
    profiles: ['0.32'], kinds: ['full_attention', 'sliding_window'],
    hash_algos: ['sha256', 'sha256_cbor'],
    ops: OPS, checkpoint_fields: ['free_queue', 'num_free', 'usage', 'stats', 'events',
      'free_queue_digest'],
    inspect: true,
    restart: true,  // a new `start` discards every state: one process serves many runs
  },
};

// -- JSON out, with exact 64-bit integers (BigInt) -------------------------------
function toJson(v) {
  if (typeof v === 'bigint') return v.toString();
  if (v === null || v === undefined) return 'null';
  if (Array.isArray(v)) return '[' + v.map(toJson).join(',') + ']';
  if (typeof v === 'object') {
    return '{' + Object.keys(v).filter((k) => v[k] !== undefined)
      .map((k) => JSON.stringify(k) + ':' + toJson(v[k])).join(',') + '}';
  }
  return JSON.stringify(v);
}
function send(msg) { process.stdout.write(toJson(msg) + '\n'); }

// -- serialisers: Python's pickle (protocol 5) and canonical CBOR -----------------
// Values: Buffer (bytes), string, integer (number), null, arrays standing for tuples.
function pickleValue(v, out) {
  if (v === null) { out.push(Buffer.from('N')); return; }
  if (Buffer.isBuffer(v)) {
    if (v.length < 256) out.push(Buffer.from([0x43, v.length]));
    else { const h = Buffer.alloc(5); h[0] = 0x42; h.writeUInt32LE(v.length, 1); out.push(h); }
    out.push(v, Buffer.from([0x94]));
    return;
  }
  if (typeof v === 'string') {
    const b = Buffer.from(v, 'utf8');
    if (b.length < 256) out.push(Buffer.from([0x8c, b.length]));
    else { const h = Buffer.alloc(5); h[0] = 0x58; h.writeUInt32LE(b.length, 1); out.push(h); }
    out.push(b, Buffer.from([0x94]));
    return;
  }
  if (typeof v === 'number') {
    if (v >= 0 && v <= 0xff) out.push(Buffer.from([0x4b, v]));
    else if (v >= 0 && v <= 0xffff) { const b = Buffer.alloc(3); b[0] = 0x4d; b.writeUInt16LE(v, 1); out.push(b); }
    else if (v >= -0x80000000 && v < 0x80000000) { const b = Buffer.alloc(5); b[0] = 0x4a; b.writeInt32LE(v, 1); out.push(b); }
    else out.push(pickleLong(BigInt(v)));
    return;
  }
  if (Array.isArray(v)) {
    if (v.length === 0) { out.push(Buffer.from(')')); return; }
    if (v.length > 3) out.push(Buffer.from('('));
    for (const x of v) pickleValue(x, out);
    out.push(Buffer.from([v.length > 3 ? 0x74 : 0x84 + v.length, 0x94]));
    return;
  }
  throw new Error('cannot pickle ' + typeof v);
}
function pickleLong(x) {  // LONG1: little-endian two's complement, fewest bytes
  const bytes = [];
  let n = x;
  for (;;) {
    const b = Number(n & 0xffn);
    bytes.push(b);
    n >>= 8n;
    if ((n === 0n && !(b & 0x80)) || (n === -1n && (b & 0x80))) break;
  }
  return Buffer.from([0x8a, bytes.length, ...bytes]);
}
function pickle(v) {
  const body = [];
  pickleValue(v, body);
  body.push(Buffer.from('.'));
  const payload = Buffer.concat(body);
  const frame = Buffer.alloc(9);
  frame[0] = 0x95;
  frame.writeBigUInt64LE(BigInt(payload.length), 1);
  return Buffer.concat([Buffer.from([0x80, 0x05]), frame, payload]);
}
function cborHead(major, n, out) {
  if (n < 24) out.push(Buffer.from([(major << 5) | n]));
  else if (n < 0x100) out.push(Buffer.from([(major << 5) | 24, n]));
  else if (n < 0x10000) { const b = Buffer.alloc(3); b[0] = (major << 5) | 25; b.writeUInt16BE(n, 1); out.push(b); }
  else if (n < 0x100000000) { const b = Buffer.alloc(5); b[0] = (major << 5) | 26; b.writeUInt32BE(n, 1); out.push(b); }
  else { const b = Buffer.alloc(9); b[0] = (major << 5) | 27; b.writeBigUInt64BE(BigInt(n), 1); out.push(b); }
}
function cborValue(v, out) {
  if (v === null) out.push(Buffer.from([0xf6]));
  else if (Buffer.isBuffer(v)) { cborHead(2, v.length, out); out.push(v); }
  else if (typeof v === 'string') { const b = Buffer.from(v, 'utf8'); cborHead(3, b.length, out); out.push(b); }
  else if (typeof v === 'number') { if (v >= 0) cborHead(0, v, out); else cborHead(1, -1 - v, out); }
  else if (Array.isArray(v)) { cborHead(4, v.length, out); for (const x of v) cborValue(x, out); }
  else throw new Error('cannot CBOR-encode ' + typeof v);
}
function cbor(v) { const out = []; cborValue(v, out); return Buffer.concat(out); }
const sha256 = (b) => crypto.createHash('sha256').update(b).digest();
const HASHES = { sha256: (v) => sha256(pickle(v)), sha256_cbor: (v) => sha256(cbor(v)) };

// -- the free queue: a doubly linked list, head reused first ------------------------
class FreeQueue {
  constructor(blocks) {
    this.head = { id: -1 }; this.tail = { id: -2 };
    this.head.next = this.tail; this.tail.prev = this.head; this.n = 0;
    this.appendN(blocks);
  }
  remove(b) { b.prev.next = b.next; b.next.prev = b.prev; b.prev = b.next = null; this.n--; }
  popleft() { const b = this.head.next; this.remove(b); return b; }
  appendN(bs) { for (const b of bs) { const last = this.tail.prev; last.next = b; b.prev = last; b.next = this.tail; this.tail.prev = b; this.n++; } }
  prependN(bs) { let after = this.head; const before = this.head.next; for (const b of bs) { after.next = b; b.prev = after; after = b; this.n++; } after.next = before; before.prev = after; }
  ids() { const out = []; for (let b = this.head.next; b !== this.tail; b = b.next) out.push(b.id); return out; }
}

// The free-queue digest of specs/TRACE_FORMAT.md (splitmix64 of each link).
const M64 = (1n << 64n) - 1n;
function link(a, b) {
  let z = ((BigInt(a) << 32n | BigInt(b)) + 0x9E3779B97F4A7C15n) & M64;
  z = ((z ^ (z >> 30n)) * 0xBF58476D1CE4E5B9n) & M64;
  z = ((z ^ (z >> 27n)) * 0x94D049BB133111EBn) & M64;
  return z ^ (z >> 31n);
}
function digest(ids) {
  let total = 0n; let prev = 0;
  for (const id of ids) { total += link(prev, id + 2); prev = id + 2; }
  return ((total + link(prev, 1)) & M64).toString(16).padStart(16, '0');
}

// The order CPython iterates set(ids) in, for non-negative ints (hash(i) == i):
// open addressing over a power-of-two table, 9 linear probes, then perturbed.
function pythonSetOrder(ids) {
  let table = new Array(8).fill(null);
  let fill = 0;
  const place = (t, h) => {
    const mask = t.length - 1;
    let i = h & mask; let perturb = h;
    for (;;) {
      const probes = i + 9 <= mask ? 9 : 0;
      for (let j = 0; j <= probes; j++) if (t[i + j] === null) return i + j;
      perturb = Math.floor(perturb / 32);
      i = (i * 5 + 1 + perturb) & mask;
    }
  };
  for (const id of ids) {
    if (table.includes(id)) continue;
    table[place(table, id)] = id;
    fill++;
    if (fill * 5 >= (table.length - 1) * 3) {
      let size = 8;
      while (size <= fill * 4) size *= 2;
      const old = table.filter((x) => x !== null);
      table = new Array(size).fill(null);
      for (const x of old) table[place(table, x)] = x;
    }
  }
  return table.filter((x) => x !== null);
}

class Rejected extends Error { constructor(msg, field) { super(msg); this.field = field || 'req'; } }
class NotCovered extends Error {}

const cdiv = (a, b) => Math.floor((a + b - 1) / b);
const WAITING = 'waiting', RUNNING = 'running', REMOTE = 'waiting_for_remote_kvs', PREEMPTED = 'preempted';

class Manager {
  constructor(cache, profile) {
    const groups = cache.groups;
    for (const g of groups) {
      const kind = g.kind || 'full_attention';
      const fields = kind === 'sliding_window' ? ['block_size', 'kind', 'sliding_window'] : ['block_size', 'kind'];
      for (const k of Object.keys(g)) if (!fields.includes(k)) throw new NotCovered(`group field ${k}`);
    }
    // One group, or a hybrid of one full-attention and one sliding-window group
    // of the same block size (hashed at it, hit at it: no finer alignment).
    const kinds = groups.map((g) => g.kind || 'full_attention').sort().join(' + ');
    if (groups.length > 2) throw new NotCovered(`${groups.length} KV cache groups`);
    if (groups.length === 2 && kinds !== 'full_attention + sliding_window') throw new NotCovered(`groups ${kinds}`);
    if (groups.length === 2 && groups[0].block_size !== groups[1].block_size) throw new NotCovered('groups of different block sizes');
    const g = groups[0];
    const known = new Set(['num_blocks', 'groups', 'hash_algo', 'hash_seed', 'none_hash',
      'enable_caching', 'max_model_len', 'log_stats', 'enable_kv_cache_events',
      'events_use_int_hashes', 'watermark', 'max_in_flight_tokens']);
    for (const k of Object.keys(cache)) if (!known.has(k)) throw new NotCovered(`cache field ${k}`);
    if (profile.free_order !== 'unhashed_first') throw new NotCovered(`free order ${profile.free_order}`);
    this.bs = g.block_size;
    this.caching = cache.enable_caching !== false;
    this.logStats = cache.log_stats !== false;
    this.events = cache.enable_kv_cache_events !== false;
    this.intHashes = cache.events_use_int_hashes !== false;
    this.maxLen = cache.max_model_len || 65536;
    const inFlight = cache.max_in_flight_tokens === undefined || cache.max_in_flight_tokens === null
      ? this.maxLen : cache.max_in_flight_tokens;
    this.groups = groups.map((grp, idx) => {
      const kind = grp.kind || 'full_attention';
      // A sliding window w: a token reads the w - 1 tokens before it (null: full attention).
      const window = kind === 'sliding_window' ? grp.sliding_window : null;
      return {
        idx, kind, window,
        // The most blocks a window group's request holds at once: what
        // full_sequence_must_fit admits by (none for full attention).
        cap: window === null ? null : cdiv(Math.min(window - 1 + inFlight, this.maxLen), this.bs) + 1,
        suffix: idx.toString(16).padStart(8, '0'),  // the group id a block's key ends with
        tables: new Map(),  // request id -> blocks
        numCached: new Map(),  // request id -> keyed leading blocks (running requests)
      };
    });
    // Full attention is looked up first: its hit bounds the window's.
    this.lookupOrder = [...this.groups].sort((a, b) => (a.window === null ? 0 : 1) - (b.window === null ? 0 : 1));
    this.numBlocks = cache.num_blocks;
    this.watermarkBlocks = Math.floor((cache.watermark || 0) * cache.num_blocks);
    this.tagged = profile.tagged_extra_keys;
    this.hashFn = HASHES[cache.hash_algo || 'sha256'];
    const seed = cache.hash_seed === undefined ? '0' : cache.hash_seed;
    if (cache.none_hash) this.noneHash = Buffer.from(cache.none_hash, 'hex');
    else if (seed !== null) this.noneHash = this.hashFn(seed);
    else this.noneHash = this.hashFn('vllm-none-hash');  // 0.32, crypto algorithms
    this.blocks = [];
    for (let i = 0; i < this.numBlocks; i++) this.blocks.push({ id: i, ref: 0, key: null });
    this.queue = new FreeQueue(this.blocks);
    this.queue.popleft();  // block 0: the null block, never handed out
    this.null = this.blocks[0];  // where a table skips a block (out of the window)
    this.cached = new Map();  // key -> Map(block id -> block), first inserted found first
    this.reqs = new Map();
    this.kvEvents = [];
    this.stats = this.freshStats();
  }
  freshStats() { return { requests: 0, queries: 0, hits: 0, preempted_requests: 0, preempted_queries: 0, preempted_hits: 0, reset: false }; }
  req(id) { const r = this.reqs.get(id); if (!r) throw new Rejected(`no request '${id}'`); return r; }

  // -- hashing --
  extraKeys(r, start) {
    const keys = [];
    if (r.lora) keys.push(this.tagged ? ['lora', r.lora.name, r.lora.path || ''] : r.lora.name);
    if (start === 0 && r.salt) keys.push(this.tagged ? ['cache_salt', r.salt] : r.salt);
    return keys.length ? keys : null;
  }
  eventKeys(keys) {
    if (keys === null || !this.tagged) return keys;
    return keys.map((k) => (Array.isArray(k) ? k[1] : k));
  }
  hashNew(r) {
    const fresh = [];
    let begin = r.hashes.length * this.bs;
    let parent = r.hashes.length ? r.hashes[r.hashes.length - 1] : this.noneHash;
    while (begin + this.bs <= r.tokens.length) {
      parent = this.hashFn([parent, r.tokens.slice(begin, begin + this.bs), this.extraKeys(r, begin)]);
      fresh.push(parent); r.hashes.push(parent);
      begin += this.bs;
    }
    return fresh.map((h) => h.toString('hex'));
  }
  external(hash) { return this.intHashes ? hash.readBigUInt64BE(hash.length - 8) : hash.toString('hex'); }

  // -- the window --
  skipped(g, numComputed) {  // leading tokens no later token reads
    if (g.window === null) return 0;
    return Math.max(0, numComputed - g.window + 1);
  }
  removeSkipped(g, r, numComputed) {
    // Blocks wholly behind the window go back, newest first, up to the first null.
    const gone = this.skipped(g, numComputed);
    const table = g.tables.get(r.id);
    if (gone <= 0 || !table) return;
    const freed = [];
    for (let i = Math.min(Math.floor(gone / this.bs), table.length) - 1; i >= 0; i--) {
      if (table[i] === this.null) break;
      freed.push(table[i]); table[i] = this.null;
    }
    if (freed.length) this.freeBlocks(freed);
  }
  longestHit(g, r, maxTokens) {
    const most = Math.min(Math.floor(maxTokens / this.bs), r.hashes.length);
    const hit = [];
    if (g.window === null) {
      for (let i = 0; i < most; i++) {
        const b = this.findCached(r.hashes[i], g);
        if (!b) break;
        hit.push(b);
      }
      return hit;
    }
    // From the right: the first run of enough cached blocks before the hit's end
    // wins; a shorter run reaching block 0 still does (the window covers it all).
    const need = cdiv(g.window - 1, this.bs);
    let run = [], start = 0;
    for (let i = most - 1; i >= 0; i--) {
      const b = this.findCached(r.hashes[i], g);
      if (!b) { run = []; continue; }
      run.push(b);
      if (run.length >= need) { start = i; break; }
    }
    return [...new Array(start).fill(this.null), ...run.reverse()];
  }
  agreedHit(r) {
    // Each group's hit, the hybrid's agreed on: the full-attention hit bounds the
    // window's lookup (one pass agrees), then is cut to the window's length.
    const hits = this.groups.map(() => []);
    let length = r.tokens.length - 1;
    for (const g of this.lookupOrder) {
      hits[g.idx] = this.longestHit(g, r, length);
      length = hits[g.idx].length * this.bs;
    }
    for (const g of this.groups) if (g.window === null) hits[g.idx].length = length / this.bs;
    return hits;
  }

  // -- the pool --
  findCached(hash, g) {
    const m = this.cached.get(hash.toString('hex') + g.suffix);
    if (!m) return null;
    return m.values().next().value;
  }
  detach(b) {
    if (b.key === null) return;
    const m = this.cached.get(b.key);
    if (m) { m.delete(b.id); if (!m.size) this.cached.delete(b.key); }
    if (this.events) this.kvEvents.push({ type: 'BlockRemoved', block_hashes: [this.external(Buffer.from(b.key.slice(0, -8), 'hex'))], medium: 'GPU', group_idx: parseInt(b.key.slice(-8), 16) });
    b.key = null;
  }
  getNewBlocks(n) {
    const out = [];
    for (let i = 0; i < n; i++) {
      const b = this.queue.popleft();
      if (this.caching) this.detach(b);
      b.ref++; out.push(b);
    }
    return out;
  }
  touch(blocks) { for (const b of blocks) { if (b === this.null) continue; if (!b.ref) this.queue.remove(b); b.ref++; } }
  freeBlocks(ordered) {
    const front = [], back = [];
    for (const b of ordered) {
      if (b === this.null) continue;
      b.ref--;
      if (b.ref) continue;
      if (this.caching && b.key !== null) back.push(b); else front.push(b);
    }
    if (front.length) this.queue.prependN(front);
    if (back.length) this.queue.appendN(back);
  }
  cacheBlocks(g, r, numTokens) {
    const done = g.numCached.get(r.id) || 0;
    const full = Math.floor(numTokens / this.bs);
    if (done >= full) return;
    const table = g.tables.get(r.id);
    const stored = [], extras = [];
    // A window of one token needs no block before a hit's end: none is worth keying.
    const keyNone = g.window !== null && cdiv(g.window - 1, this.bs) === 0;
    for (let i = done; i < full; i++) {
      const b = table[i];
      if (b === this.null || keyNone) continue;
      const key = r.hashes[i].toString('hex') + g.suffix;
      if (b.key === null) {
        b.key = key;
        if (!this.cached.has(key)) this.cached.set(key, new Map());
        this.cached.get(key).set(b.id, b);
      }
      stored.push(this.external(r.hashes[i]));
      extras.push(this.eventKeys(this.extraKeys(r, i * this.bs)));
    }
    if (this.events) {
      this.kvEvents.push({
        type: 'BlockStored', block_hashes: stored,
        parent_block_hash: done ? this.external(r.hashes[done - 1]) : undefined,
        token_ids: r.tokens.slice(done * this.bs, full * this.bs), block_size: this.bs,
        lora_id: r.lora ? r.lora.int_id : undefined, medium: 'GPU',
        lora_name: r.lora ? r.lora.name : undefined, extra_keys: extras.length ? extras : undefined,
        group_idx: g.idx, kv_cache_spec_kind: g.kind,
        kv_cache_spec_sliding_window: g.window === null ? undefined : g.window,
        session_id: r.session || undefined,
      });
    }
    g.numCached.set(r.id, full);
  }
  releaseRequest(r) {
    for (const g of this.groups) {  // group after group
      const table = g.tables.get(r.id) || [];
      // Tail first: the last blocks of a request are the least likely to be hit.
      this.freeBlocks(BUG === 'eviction-order' ? table : [...table].reverse());
      g.tables.delete(r.id); g.numCached.delete(r.id);
    }
  }
  blocksToAllocate(g, r, numTokens, hit, totalComputed, capped = false) {
    let wanted = cdiv(numTokens, this.bs);
    if (capped && g.cap !== null && g.cap < wanted) wanted = g.cap;
    const held = (g.tables.get(r.id) || []).length;
    if (g.numCached.has(r.id)) return Math.max(0, wanted - held);
    const gone = Math.floor(this.skipped(g, totalComputed) / this.bs);
    const fresh = Math.max(0, wanted - Math.max(gone, hit.length + held));
    // Hit blocks in the free queue leave it when taken (not those behind the window).
    return fresh + hit.slice(Math.max(0, gone - held)).filter((b) => !b.ref && b !== this.null).length;
  }
  adoptHit(g, r, hit, local, ext) {
    const gone = Math.floor(this.skipped(g, local + ext) / this.bs);
    const kept = gone > 0 ? hit.slice(gone) : hit;
    this.touch(kept);
    const table = [...new Array(Math.max(gone, 0)).fill(this.null), ...kept];
    g.tables.set(r.id, table);
    g.numCached.set(r.id, table.length);
  }
  allocateExternal(g, r, local, ext) {
    const total = local + ext;
    const gone = this.skipped(g, total);
    if (gone > 0) ext = Math.min(total - gone, ext);  // 0.32: no slot for tokens out of the window
    if (ext <= 0) return;
    if (!g.tables.has(r.id)) g.tables.set(r.id, []);
    const table = g.tables.get(r.id);
    table.push(...this.getNewBlocks(Math.max(0, cdiv(total, this.bs) - table.length)));
  }

  // -- events --
  run(ev) {
    const fn = this['op_' + ev.op];
    if (!fn) throw new NotCovered(`op ${ev.op}`);
    return fn.call(this, ev);
  }
  op_add_request(ev) {
    if (this.reqs.has(ev.req)) throw new Rejected(`request '${ev.req}' already exists`);
    for (const k of ['mm', 'prompt_embeds']) if (ev[k]) throw new NotCovered(k);
    if (ev.kv_cache_report_mode && ev.kv_cache_report_mode !== 'incremental') throw new NotCovered('kv_cache_report_mode');
    const r = { id: ev.req, tokens: [...ev.prompt], numPrompt: ev.prompt.length, lora: ev.lora || null,
      salt: ev.cache_salt || null, session: ev.session_id || null, skipRead: !!ev.skip_reading_prefix_cache,
      hashes: [], computed: 0, status: WAITING, preemptions: 0, hit: null };
    this.reqs.set(ev.req, r);
    return { block_hashes: this.hashNew(r) };
  }
  op_lookup(ev) {
    const r = this.req(ev.req);
    if (ev.max_cache_hit_length !== undefined && ev.max_cache_hit_length !== null) throw new NotCovered('max_cache_hit_length');
    if (r.computed) throw new Rejected(`vLLM rejects this: request '${r.id}' is running`);
    const hits = this.caching && !r.skipRead ? this.agreedHit(r) : this.groups.map(() => []);
    r.hit = hits;
    const answer = { hit_tokens: this.hitTokens(hits), block_ids: hits.map((h) => h.map((b) => b.id)) };
    // A connector's lookup: with no Mamba group it is the plain one, never diverged.
    if (ev.for_connector) answer.hit_diverged = false;
    return answer;
  }
  op_truncate_computed_blocks(ev) {
    const r = this.req(ev.req);
    if (r.hit === null) throw new Rejected(`request '${r.id}' has no pending lookup hit to truncate`, 'req');
    const n = ev.num_computed_tokens;
    if (n % this.bs || n / this.bs > r.hit[0].length) throw new Rejected(`vLLM rejects this: AssertionError: ${n} tokens`, 'num_computed_tokens');
    r.hit = r.hit.map((h) => h.slice(0, n / this.bs));
    return { block_ids: r.hit.map((h) => h.map((b) => b.id)) };
  }
  hitTokens(hits) {  // every group's hit ends at the same token
    return hits[0].length * this.bs;
  }
  op_allocate(ev) {
    const r = this.req(ev.req);
    const numNew = ev.num_new_tokens, ahead = ev.num_lookahead_tokens || 0;
    const ext = ev.num_external_computed_tokens || 0;
    if (ev.num_encoder_tokens) throw new NotCovered('num_encoder_tokens');
    const reserved = ev.reserved_blocks || 0;  // kept free for others: only this allocation counts them
    const hits = r.hit; r.hit = null;
    const hitTokens = hits ? this.hitTokens(hits) : 0;
    if (!(numNew || ext || hitTokens)) throw new Rejected('vLLM rejects this: ValueError: nothing to allocate', 'num_new_tokens');
    const local = r.computed + hitTokens;
    const computed = Math.min(local + ext, this.maxLen);
    const scheduled = ev.has_scheduled_reqs === undefined ? true : ev.has_scheduled_reqs;
    const headroom = scheduled && (r.status === WAITING || r.status === PREEMPTED) ? this.watermarkBlocks : 0;
    const hitOf = (g) => (hits ? hits[g.idx] : []);
    const needed = (numTokens, total, capped) => this.groups.reduce(
      (n, g) => n + this.blocksToAllocate(g, r, numTokens, hitOf(g), total, capped), 0);
    if (ev.full_sequence_must_fit) {
      const whole = Math.min(r.tokens.length, this.maxLen);
      if (needed(whole, computed, true) + headroom > this.queue.n) return { refused: true };
    }
    const slots = Math.min(computed + numNew + ahead, this.maxLen);
    // What the window has left goes back first, even if the allocation is then refused.
    for (const g of this.groups) this.removeSkipped(g, r, computed);
    if (needed(slots, local + ext, false) + headroom > this.queue.n - reserved) return { refused: true };
    const running = this.groups.some((g) => g.numCached.has(r.id));  // adopts nothing
    if ((hits !== null || ext > 0) && !running) {
      // Every group's hit is held before any group takes blocks for external tokens.
      for (const g of this.groups) this.adoptHit(g, r, hitOf(g), local, ext);
      if (ext > 0) for (const g of this.groups) this.allocateExternal(g, r, local, ext);
    }
    const fresh = this.groups.map((g) => {
      if (!g.tables.has(r.id)) g.tables.set(r.id, []);
      if (!g.numCached.has(r.id)) g.numCached.set(r.id, 0);
      const table = g.tables.get(r.id);
      const missing = cdiv(slots, this.bs) - table.length;
      const grown = missing > 0 ? this.getNewBlocks(missing) : [];
      table.push(...grown);
      return grown;
    });
    if (!ev.delay_cache_blocks && this.caching) {
      for (const g of this.groups) this.cacheBlocks(g, r, Math.min(computed + numNew, r.tokens.length));
    }
    r.computed += hitTokens + ext + numNew;
    r.status = ev.delay_cache_blocks ? REMOTE : RUNNING;
    return { block_ids: fresh.map((grown) => grown.map((b) => b.id)) };
  }
  op_append_tokens(ev) { const r = this.req(ev.req); r.tokens.push(...ev.tokens); return { block_hashes: this.hashNew(r) }; }
  op_cache_blocks(ev) {
    const r = this.req(ev.req);
    if (this.caching) {
      const full = Math.floor(ev.num_computed_tokens / this.bs);
      for (const g of this.groups) {
        const held = (g.tables.get(r.id) || []).length;
        if (full > held) throw new Rejected(`vLLM rejects this: ${full} blocks, request holds ${held}`, 'num_computed_tokens');
      }
      for (const g of this.groups) this.cacheBlocks(g, r, ev.num_computed_tokens);
    }
    if (r.status === REMOTE) r.status = WAITING;
    return {};
  }
  op_record_stats(ev) {
    const r = this.req(ev.req);
    if (this.logStats && this.caching && !r.skipRead) {
      const s = this.stats;
      if (r.preemptions > 0) { s.preempted_requests++; s.preempted_queries += r.tokens.length; s.preempted_hits += ev.num_hits; }
      else { s.requests++; s.queries += r.tokens.length; s.hits += ev.num_hits; }
    }
    return {};
  }
  op_free(ev) { const r = this.req(ev.req); this.releaseRequest(r); this.reqs.delete(r.id); return {}; }
  op_preempt(ev) {
    const r = this.req(ev.req);
    this.releaseRequest(r); r.hit = null; r.computed = 0; r.preemptions++; r.status = PREEMPTED;
    return {};
  }
  op_reset_prefix_cache() {
    if (this.queue.n !== this.numBlocks - 1) return { ok: false };
    this.cached.clear();
    for (const b of this.blocks) b.key = null;
    if (this.events) this.kvEvents.push({ type: 'AllBlocksCleared' });
    if (this.logStats) this.stats.reset = true;
    return { ok: true };
  }
  op_evict_blocks(ev) {
    // vLLM walks a Python set of the ids: its removal events come in that order.
    for (const id of pythonSetOrder(ev.block_ids)) {
      if (id < 0 || id >= this.numBlocks) throw new Rejected(`no block ${id}`, 'block_ids');
      this.detach(this.blocks[id]);
    }
    return {};
  }
  op_step() { return {}; }
  op_take_block_copies() { return { copies: [] }; }
  op_checkpoint(ev) {
    const out = {};
    for (const f of ev.fields || ['free_queue', 'num_free', 'usage', 'stats', 'events']) {
      if (f === 'free_queue') out[f] = this.queue.ids();
      else if (f === 'free_queue_digest') out[f] = digest(this.queue.ids());
      else if (f === 'num_free') out[f] = this.queue.n;
      else if (f === 'usage') out[f] = this.numBlocks > 1 ? 1 - this.queue.n / (this.numBlocks - 1) : 0;
      else if (f === 'stats') { out[f] = this.logStats ? this.stats : null; this.stats = this.freshStats(); }
      else if (f === 'events') { out[f] = this.events ? this.kvEvents : []; this.kvEvents = []; }
      else throw new NotCovered(`checkpoint field ${f}`);
    }
    return out;
  }
  inspect(msg) {
    if (msg.what === 'block_table') return this.groups.map((g) => (g.tables.get(msg.req) || []).map((b) => b.id));
    const b = this.blocks[msg.block_id];
    if (!b) return null;
    return { block_id: b.id, ref_cnt: b.ref, hash: b.key ? b.key.slice(0, 12) : null, free: b.ref === 0 && b.id !== 0 };
  }
}

let manager = null;
send(HELLO);
const rl = readline.createInterface({ input: process.stdin, terminal: false });
rl.on('line', (line) => {
  const msg = JSON.parse(line);
  try {
    if (msg.type === 'start') {
      try { manager = new Manager(msg.cache, msg.profile); send({ ok: true }); } catch (e) {
        if (e instanceof NotCovered) send({ not_covered: e.message }); else throw e;
      }
    } else if (msg.type === 'event') {
      send({ seq: msg.seq, answer: manager.run(msg.event) });
    } else if (msg.type === 'inspect') {
      send({ seq: msg.seq, answer: manager.inspect(msg) });
    } else if (msg.type === 'close') {
      process.exit(0);
    }
  } catch (e) {
    if (e instanceof Rejected) send({ seq: msg.seq, rejected: { message: e.message, field: e.field } });
    else if (e instanceof NotCovered) send({ seq: msg.seq, not_covered: e.message });
    else { process.stderr.write(`node backend: ${e.stack}\n`); process.exit(70); }
  }
});
rl.on('close', () => process.exit(0));
