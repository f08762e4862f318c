'use strict';
// A peer for event streams: Node's own `http`, one process, written as
// Node's documentation and most tutorials write an SSE server.
//
// node server.js PORT
// - answers a GET with `Accept: text/event-stream` on any path with 200
//   and a stream; anything else with 404;
// - sends every standard-input line to every stream as one event, with a
//   numeric id: the event is formatted once and the same string written to
//   every response;
// - a comment line every 30 s keeps idle streams alive through proxies;
// - standard input's end does not stop it; nothing is logged per stream.

const http = require('http');
const readline = require('readline');

const port = Number.parseInt(process.argv[2], 10);
if (!Number.isInteger(port)) {
  console.error('usage: node server.js PORT');
  process.exit(2);
}

const streams = new Set();

const server = http.createServer((req, res) => {
  if (req.method !== 'GET' || !(req.headers.accept || '').includes('text/event-stream')) {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, {
    'Content-Type': 'text/event-stream',
    'Cache-Control': 'no-store',
    Connection: 'keep-alive',
  });
  res.write('retry: 2000\n\n');
  streams.add(res);
  req.on('close', () => streams.delete(res));
});
// Streams stay open: no request or keep-alive timeout applies to them.
server.requestTimeout = 0;
server.listen({ host: '0.0.0.0', port, backlog: 4096 }, () => {
  console.error(`node-sse peer listening on 0.0.0.0:${port}`);
});

let id = 0;
readline
  .createInterface({ input: process.stdin, crlfDelay: Infinity })
  .on('line', (line) => {
    id += 1;
    const event = `id: ${id}\ndata: ${line}\n\n`;
    for (const res of streams) res.write(event);
  })
  .on('close', () => {});

setInterval(() => {
  for (const res of streams) res.write(':\n\n');
}, 30_000).unref();
