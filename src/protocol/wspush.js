// wspush.js: a browser client for wspush that reconnects by itself and
// resumes where it left off: no message is lost, and a loss is told.
//
//   const push = wspush.connect("wss://push.example.com/", {
//     channels: ["news"], id: "alice", token: "...",
//     getToken() {},  // or: a token (or its promise) per connection;
//                     // a 4001 close (expired) reconnects at once
//     onmessage(data, position) {},  // data: a string or an ArrayBuffer
//     ongap(from, to, position) {},  // from..to lost; what follows is after `to`
//     onunknown(position) {},  // the server could not place us: reload state
//     onstate(state, close) {},  // "open", or "closed" with the CloseEvent
//     onstatus(status) {},  // {status: "position"|"recovered"|"gap"|"unknown"
//                           // |"reconnect", ...}: first, where a gap falls,
//                           // and a drain's hint before its 1012
//   });
//   push.position;  // the last one seen (store it to resume after a reload)
//   push.close();
(function (root) {
  "use strict";

  // Reconnects wait a random time from MIN_DELAY to a ceiling that starts
  // at FIRST_CEILING and doubles with each failed try, up to MAX_DELAY
  // (ms): the clients of a server that went away come back spread out.
  const MIN_DELAY = 500, FIRST_CEILING = 3000, MAX_DELAY = 20000;
  const STABLE = 10000; // a connection open this long resets the backoff
  const TOKEN_EXPIRED = 4001; // the server's close when a signed token expires
  const LONG_HIDDEN = 60000; // a page hidden this long reconnects when shown

  function connect(url, options) {
    const o = options || {};
    let position = o.since || null;
    let ws = null, timer = null, attempt = 0, openedAt = 0, hiddenAt = 0, done = false;
    let dialing = 0; // counts opens: a late token is for the last one only
    let hint = null; // the delay a draining server asked for (ms)
    const call = (name, ...args) => { if (o[name]) o[name](...args); };

    function address(token) {
      const u = new URL(url, root.location ? root.location.href : undefined);
      if (u.protocol === "http:") u.protocol = "ws:";
      if (u.protocol === "https:") u.protocol = "wss:";
      const q = u.searchParams;
      for (const channel of o.channels || []) q.append("channel", channel);
      if (o.id) q.set("id", o.id);
      if (token) q.set("token", token);
      if (position) q.set("since", position); else q.set("positions", "1");
      return u.toString();
    }

    function open() {
      clearTimeout(timer);
      timer = null;
      if (!o.getToken) return dial(o.token);
      const mine = ++dialing;
      Promise.resolve()
        .then(() => o.getToken())
        .then(
          (token) => { if (mine === dialing && !done && !ws) dial(token); },
          (error) => {
            if (mine !== dialing || done) return;
            call("onstate", "closed", error);
            retry();
          });
    }

    function dial(token) {
      ws = new WebSocket(address(token));
      ws.binaryType = "arraybuffer";
      ws.onopen = () => { openedAt = Date.now(); call("onstate", "open"); };
      ws.onmessage = (e) => receive(e.data);
      ws.onclose = (e) => {
        ws = null;
        call("onstate", "closed", e);
        if (done) return;
        if (e.code === TOKEN_EXPIRED && o.getToken) { attempt = 0; openedAt = 0; open(); }
        else retry();
      };
    }

    function receive(data) {
      if (typeof data === "string") {
        if (data[0] === "{") return status(JSON.parse(data));
        const space = data.indexOf(" ");
        position = data.slice(0, space);
        return call("onmessage", data.slice(space + 1), position);
      }
      const bytes = new Uint8Array(data);
      const space = bytes.indexOf(32);
      position = String.fromCharCode(...bytes.subarray(0, space));
      call("onmessage", data.slice(space + 1), position);
    }

    // The first thing a connection is told: where it stands.
    function status(s) {
      call("onstatus", s);
      if (s.status === "position" && !position) position = s.position;
      if (s.status === "gap") {
        // What follows is after `to`: a resume goes on from there.
        position = s.to;
        call("ongap", s.from, s.to, s.position);
      }
      if (s.status === "unknown") {
        position = s.position;
        call("onunknown", s.position);
      }
      // The server drains: it closes this connection next, and spreads
      // its clients' returns by the delay it gives each.
      if (s.status === "reconnect") hint = Math.max(0, Number(s.delay_ms) || 0);
    }

    function retry() {
      if (hint !== null) {
        timer = setTimeout(open, hint);
        hint = null;
        attempt = 0;
        openedAt = 0;
        return;
      }
      if (openedAt && Date.now() - openedAt >= STABLE) attempt = 0;
      openedAt = 0;
      const ceiling = Math.min(MAX_DELAY, FIRST_CEILING * 2 ** attempt++);
      timer = setTimeout(open, MIN_DELAY + Math.random() * (ceiling - MIN_DELAY));
    }

    // Reconnect now: back online, or shown after a long hidden spell (the
    // socket may have died without a word).
    function now() {
      if (done) return;
      if (ws) { ws.onclose = null; ws.close(); ws = null; }
      attempt = 0;
      open();
    }
    const online = () => now();
    const visibility = () => {
      if (root.document.hidden) hiddenAt = Date.now();
      else if (hiddenAt && Date.now() - hiddenAt >= LONG_HIDDEN) now();
    };
    if (root.addEventListener) root.addEventListener("online", online);
    if (root.document) root.document.addEventListener("visibilitychange", visibility);

    open();
    return {
      get position() { return position; },
      close() {
        done = true;
        clearTimeout(timer);
        if (root.removeEventListener) root.removeEventListener("online", online);
        if (root.document) root.document.removeEventListener("visibilitychange", visibility);
        if (ws) ws.close();
      },
    };
  }

  root.wspush = { connect };
})(typeof window !== "undefined" ? window : globalThis);
