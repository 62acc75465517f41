#!/usr/bin/env node
// Prisma's query engine for LiteLLM's proxy, from the npm registry: bench/gateway_peer.py
// --litellm-db (issue 30, item 3). bench/README.md says why it exists.
//
// LiteLLM's proxy reaches its database through prisma-client-py 0.15, which starts Prisma's
// native query engine (5.17.0, commit 393aa359) as a child process and speaks GraphQL to it over
// HTTP. The native engine is downloaded from Prisma's own binary host at first start, which
// this machine cannot reach; the same engine, built from the same commit to WebAssembly, is
// on the npm registry (@prisma/query-engine-wasm), driven through Prisma's PostgreSQL driver
// adapter (@prisma/adapter-pg, node-postgres). That build speaks only Prisma's JSON protocol,
// so this program stands where the binary would: the binary's command line and HTTP routes,
// each GraphQL document prisma-client-py builds translated to the JSON protocol and each
// answer back (the result under its alias, typed values unwrapped as the GraphQL protocol
// returns them). The queries, their SQL and the database are Prisma's and PostgreSQL's own.
//
//   prisma_wasm_engine.mjs --version
//   prisma_wasm_engine.mjs -p PORT [--enable-metrics] [--enable-raw-queries]
//     (PRISMA_DML_PATH: the schema; DATABASE_URL or OVERWRITE_DATASOURCES: the database)
//
// Its packages come from PRISMA_WASM_MODULES (a node_modules directory; gateway_peer.py
// installs them, pinned, under $ACS_CACHE_DIR/bench/prisma-wasm).

import fs from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const ENGINE_COMMIT = '393aa359c9ad4a4bb28630fb5613f9c281cde053';

const argv = process.argv.slice(2);
if (argv.includes('--version') || argv[0] === 'version') {
  process.stdout.write(`query-engine ${ENGINE_COMMIT}\n`);
  process.exit(0);
}

const modules = process.env.PRISMA_WASM_MODULES;
if (!modules) {
  console.error('PRISMA_WASM_MODULES is not set (the node_modules with @prisma/query-engine-wasm)');
  process.exit(2);
}
const require = createRequire(path.join(modules, 'noop.js'));
const pg = require('pg');
const { PrismaPg } = require('@prisma/adapter-pg');
const { bindAdapter } = require('@prisma/driver-adapter-utils');

// --- the GraphQL subset prisma-client-py writes (its _builder.py) ---------------------------
// Documents are `query|mutation { alias: name(args) { selection } }`; every argument value is
// JSON (json.dumps), object keys and field names are bare names.

function tokenize(text) {
  const tokens = [];
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === ' ' || c === '\n' || c === '\t' || c === '\r' || c === ',') {
      i += 1;
    } else if ('{}()[]:'.includes(c)) {
      tokens.push({ t: c });
      i += 1;
    } else if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      tokens.push({ t: 'value', v: JSON.parse(text.slice(i, j + 1)) });
      i = j + 1;
    } else if (c === '-' || (c >= '0' && c <= '9')) {
      const m = /^-?\d+(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i));
      tokens.push({ t: 'value', v: Number(m[0]) });
      i += m[0].length;
    } else {
      const m = /^[A-Za-z_][A-Za-z0-9_]*/.exec(text.slice(i));
      if (!m) throw new Error(`unexpected ${JSON.stringify(text.slice(i, i + 20))}`);
      const word = m[0];
      if (word === 'true' || word === 'false') tokens.push({ t: 'value', v: word === 'true' });
      else if (word === 'null') tokens.push({ t: 'value', v: null });
      else tokens.push({ t: 'name', v: word });
      i += word.length;
    }
  }
  return tokens;
}

class Parser {
  constructor(text) {
    this.tokens = tokenize(text);
    this.at = 0;
  }
  peek() { return this.tokens[this.at]; }
  next(kind) {
    const token = this.tokens[this.at++];
    if (!token || (kind && token.t !== kind)) {
      throw new Error(`expected ${kind}, found ${token ? token.t : 'the end'}`);
    }
    return token;
  }
  document() {
    const operation = this.next('name').v;
    this.next('{');
    const fields = this.fields();
    return { operation, fields };
  }
  fields() { // after `{`, up to and with `}`
    const out = [];
    while (this.peek().t !== '}') out.push(this.field());
    this.next('}');
    return out;
  }
  field() {
    let name = this.next('name').v;
    let alias = name;
    if (this.peek().t === ':') {
      this.next(':');
      name = this.next('name').v;
    }
    let args = {};
    if (this.peek() && this.peek().t === '(') {
      this.next('(');
      while (this.peek().t !== ')') {
        const key = this.next('name').v;
        this.next(':');
        args[key] = this.value();
      }
      this.next(')');
    }
    let selection = null;
    if (this.peek() && this.peek().t === '{') {
      this.next('{');
      selection = this.fields();
    }
    return { alias, name, args, selection };
  }
  value() {
    const token = this.next();
    if (token.t === 'value') return token.v;
    if (token.t === 'name') return token.v; // an enum written bare
    if (token.t === '[') {
      const list = [];
      while (this.peek().t !== ']') list.push(this.value());
      this.next(']');
      return list;
    }
    if (token.t === '{') {
      const object = {};
      while (this.peek().t !== '}') {
        const key = this.next('name').v;
        this.next(':');
        object[key] = this.value();
      }
      this.next('}');
      return object;
    }
    throw new Error(`unexpected ${token.t}`);
  }
}

// --- GraphQL protocol -> JSON protocol -------------------------------------------------------

const ACTIONS = [
  'findUnique', 'findFirst', 'findMany', 'createOne', 'createMany', 'updateOne', 'updateMany',
  'upsertOne', 'deleteOne', 'deleteMany', 'aggregate', 'groupBy',
];

function selectionOf(fields) {
  const selection = {};
  for (const f of fields || []) {
    if (f.selection === null && Object.keys(f.args).length === 0) selection[f.name] = true;
    else selection[f.name] = { arguments: f.args, selection: selectionOf(f.selection) };
  }
  return selection;
}

// The datamodel's fields by model: { model: { field: type } }, a relation's type being the
// other model's name.
function fieldsOf(datamodel) {
  const models = new Map();
  for (const m of datamodel.matchAll(/^model\s+(\w+)\s*\{([\s\S]*?)^\}/gm)) {
    const fields = {};
    for (const line of m[2].split('\n')) {
      const f = /^\s*(\w+)\s+(\w+)/.exec(line);
      if (f) fields[f[1]] = f[2];
    }
    models.set(m[1], fields);
  }
  return models;
}

// prisma-client-py writes a Json field's value as a string of JSON (and Bytes as base64), which
// the GraphQL protocol parses as such; the JSON protocol reads a bare string as a JSON string
// value, so it is tagged here, in written data and in `equals`/`not` filters.
const TAGGED = { Json: 'Json', Bytes: 'Bytes' };
const tag = (type, v) => (typeof v === 'string' ? { $type: TAGGED[type], value: v } : v);

function fixData(data, model, models) {
  if (Array.isArray(data)) return data.map((d) => fixData(d, model, models));
  if (data === null || typeof data !== 'object') return data;
  const fields = models.get(model) || {};
  const out = {};
  for (const [key, value] of Object.entries(data)) {
    const type = fields[key];
    if (TAGGED[type]) out[key] = tag(type, value);
    else if (models.has(type)) out[key] = fixNested(value, type, models);
    else out[key] = value;
  }
  return out;
}

// A relation's nested writes: create, createMany: {data}, update (its data, or {where, data}),
// upsert ({create, update}), connectOrCreate ({where, create}), updateMany ({where, data}).
function fixNested(ops, model, models) {
  if (ops === null || typeof ops !== 'object') return ops;
  const out = {};
  for (const [op, value] of Object.entries(ops)) {
    const many = Array.isArray(value) ? value : [value];
    const fixed = many.map((v) => {
      if (v === null || typeof v !== 'object') return v;
      if (op === 'create') return fixData(v, model, models);
      if (op === 'createMany' || op === 'updateMany') return { ...v, data: fixData(v.data, model, models) };
      if (op === 'update' && 'where' in v && 'data' in v) return { ...v, data: fixData(v.data, model, models) };
      if (op === 'update') return fixData(v, model, models);
      if (op === 'upsert' || op === 'connectOrCreate') {
        const w = { ...v };
        if ('create' in w) w.create = fixData(w.create, model, models);
        if ('update' in w) w.update = fixData(w.update, model, models);
        return w;
      }
      return v;
    });
    out[op] = Array.isArray(value) ? fixed : fixed[0];
  }
  return out;
}

function fixWhere(where, model, models) {
  if (Array.isArray(where)) return where.map((w) => fixWhere(w, model, models));
  if (where === null || typeof where !== 'object') return where;
  const fields = models.get(model) || {};
  const out = {};
  for (const [key, value] of Object.entries(where)) {
    const type = fields[key];
    if (key === 'AND' || key === 'OR' || key === 'NOT') out[key] = fixWhere(value, model, models);
    else if (TAGGED[type] && value !== null && typeof value === 'object') {
      out[key] = { ...value };
      for (const k of ['equals', 'not']) if (k in value) out[key][k] = tag(type, value[k]);
    } else if (TAGGED[type]) out[key] = tag(type, value);
    else if (models.has(type) && value !== null && typeof value === 'object') {
      const wrapped = ['is', 'isNot', 'some', 'every', 'none'].some((k) => k in value);
      out[key] = wrapped
        ? Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fixWhere(v, type, models)]))
        : fixWhere(value, type, models);
    } else out[key] = value;
  }
  return out;
}

function fixArguments(args, model, models) {
  const out = { ...args };
  for (const key of ['data', 'create', 'update']) {
    if (key in out) out[key] = fixData(out[key], model, models);
  }
  if ('where' in out) out.where = fixWhere(out.where, model, models);
  return out;
}

function toJsonProtocol(query, models) {
  const doc = new Parser(query).document();
  if (doc.fields.length !== 1) throw new Error('one field a document is supported');
  const field = doc.fields[0];
  const request = { query: { arguments: field.args, selection: selectionOf(field.selection) } };
  if (field.name === 'queryRaw' || field.name === 'executeRaw') {
    request.action = field.name;
    request.query.selection = {};
    return { request, alias: field.alias, raw: true };
  }
  let name = field.name;
  let orThrow = '';
  if (name.endsWith('OrThrow')) {
    name = name.slice(0, -'OrThrow'.length);
    orThrow = 'OrThrow';
  }
  const action = ACTIONS.find((a) => name.startsWith(a) && models.has(name.slice(a.length)));
  if (!action) throw new Error(`unknown operation ${field.name}`);
  request.modelName = name.slice(action.length);
  request.query.arguments = fixArguments(field.args, request.modelName, models);
  request.action = action + orThrow;
  return { request, alias: field.alias, raw: false };
}

// The JSON protocol tags DateTime, Json, BigInt, Decimal and Bytes as {$type, value}; the
// GraphQL protocol prisma-client-py parses returns the bare value.
function untag(value) {
  if (Array.isArray(value)) return value.map(untag);
  if (value !== null && typeof value === 'object') {
    if (typeof value.$type === 'string' && 'value' in value && Object.keys(value).length === 2) {
      return value.value;
    }
    const out = {};
    for (const [k, v] of Object.entries(value)) out[k] = untag(v);
    return out;
  }
  return value;
}

function answerOf(response, alias, raw) {
  if (!response.data) return response;
  const [value] = Object.values(response.data);
  return { data: { [alias]: raw ? value : untag(value) } };
}

// --- the engine and its HTTP routes ----------------------------------------------------------

function databaseUrl() {
  if (process.env.OVERWRITE_DATASOURCES) {
    const [first] = JSON.parse(process.env.OVERWRITE_DATASOURCES);
    if (first && first.url) return first.url;
  }
  if (!process.env.DATABASE_URL) throw new Error('DATABASE_URL is not set');
  return process.env.DATABASE_URL;
}

// Prisma's own URL parameters are not PostgreSQL's: connection_limit sizes the pool, the
// others are dropped (node-postgres would send them to the server as settings).
function poolConfig(url) {
  const parsed = new URL(url);
  const limit = Number(parsed.searchParams.get('connection_limit') || '10');
  for (const key of [...parsed.searchParams.keys()]) {
    if (key !== 'options' && key !== 'application_name') parsed.searchParams.delete(key);
  }
  return { connectionString: parsed.toString(), max: limit };
}

async function loadEngine(datamodel) {
  const dir = path.join(modules, '@prisma', 'query-engine-wasm', 'postgresql');
  const bg = await import(pathToFileURL(path.join(dir, 'query_engine_bg.js')).href);
  const bytes = fs.readFileSync(path.join(dir, 'query_engine_bg.wasm'));
  const { instance } = await WebAssembly.instantiate(bytes, { './query_engine_bg.js': bg });
  bg.__wbg_set_wasm(instance.exports);
  const pool = new pg.Pool(poolConfig(databaseUrl()));
  const log = (line) => {
    if (process.env.RUST_LOG === 'info') process.stderr.write(`${line}\n`);
  };
  const engine = new bg.QueryEngine(
    { datamodel, logLevel: 'error', logQueries: false }, log, bindAdapter(new PrismaPg(pool)),
  );
  await engine.connect('{}');
  return engine;
}

const stats = { queries: 0, batches: 0, transactions: 0 };

async function query(engine, models, body, txId) {
  const payload = JSON.parse(body);
  if (payload.batch) {
    stats.batches += 1;
    const parts = payload.batch.map((item) => toJsonProtocol(item.query, models));
    const batch = { batch: parts.map((p) => p.request) };
    if (payload.transaction) batch.transaction = {};
    stats.queries += parts.length;
    const answer = JSON.parse(await engine.query(JSON.stringify(batch), '{}', txId));
    if (!answer.batchResult) return answer;
    return {
      batchResult: answer.batchResult.map((r, i) => answerOf(r, parts[i].alias, parts[i].raw)),
    };
  }
  stats.queries += 1;
  const { request, alias, raw } = toJsonProtocol(payload.query, models);
  return answerOf(JSON.parse(await engine.query(JSON.stringify(request), '{}', txId)), alias, raw);
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

async function main() {
  const portAt = argv.findIndex((a) => a === '-p' || a === '--port');
  const port = Number(argv[portAt + 1]);
  if (portAt < 0 || !port) {
    // Run as the schema engine (PRISMA_SCHEMA_ENGINE_BINARY, `prisma migrate diff`): not one.
    throw new Error('a query engine only (usage: prisma_wasm_engine.mjs -p PORT); '
      + 'the schema engine is not available here, see bench/README.md');
  }
  const datamodel = fs.readFileSync(process.env.PRISMA_DML_PATH, 'utf8');
  const models = fieldsOf(datamodel);
  const engine = await loadEngine(datamodel);

  const server = http.createServer(async (req, res) => {
    const send = (status, value) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(typeof value === 'string' ? value : JSON.stringify(value));
    };
    try {
      const url = new URL(req.url, 'http://engine');
      const body = req.method === 'POST' ? await readBody(req) : '';
      const tx = /^\/transaction\/([^/]+)\/(commit|rollback)$/.exec(url.pathname);
      if (req.method === 'GET' && url.pathname === '/status') {
        send(200, { status: 'ok' });
      } else if (req.method === 'GET' && url.pathname === '/stats') {
        send(200, stats);
      } else if (req.method === 'GET' && url.pathname === '/metrics') {
        const format = url.searchParams.get('format') || 'prometheus';
        send(200, await engine.metrics(JSON.stringify({ format })));
      } else if (req.method === 'POST' && url.pathname === '/') {
        send(200, await query(engine, models, body, req.headers['x-transaction-id']));
      } else if (req.method === 'POST' && url.pathname === '/transaction/start') {
        stats.transactions += 1;
        send(200, await engine.startTransaction(body, '{}'));
      } else if (req.method === 'POST' && tx) {
        const done = tx[2] === 'commit' ? engine.commitTransaction : engine.rollbackTransaction;
        send(200, await done.call(engine, tx[1], '{}'));
      } else {
        send(404, { errors: [{ error: `no route ${req.method} ${url.pathname}` }] });
      }
    } catch (err) {
      const message = String(err && err.message ? err.message : err);
      send(500, { errors: [{ error: message, user_facing_error: { message } }] });
    }
  });
  server.keepAliveTimeout = 60_000;
  server.listen(port, '127.0.0.1');
  const stop = () => {
    server.close(() => engine.disconnect('{}').finally(() => process.exit(0)));
    server.closeAllConnections(); // the client's idle keep-alive connections end now
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
