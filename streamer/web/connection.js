// One user session of protocol v1 (docs/protocol.md) over as many WebSocket connections as it takes.
//
// Audio goes in as 16 kHz PCM16 chunks (sendAudio); transcript events come out through the `on` callbacks with
// times in seconds of the user's session, whichever connection produced them. When a connection drops mid-session
// the session reconnects with backoff and replays the audio no final has covered yet (at most REPLAY_SECONDS),
// so the words spoken across the drop are still transcribed and the times stay continuous.

export const SAMPLE_RATE = 16000;
export const LISTEN_QUERY = "sample_rate=16000&encoding=pcm_s16le&channels=1";
export const TOKEN_SUBPROTOCOL_PREFIX = "streamer.token.";

const REPLAY_SECONDS = 30;
const MAX_ATTEMPTS = 10; // reconnections in a row before giving up
const MAX_DELAY_MS = 10_000;
const FIRST_CONTACT_ATTEMPTS = 2; // a server that never answered gets fewer tries than one that dropped us

/** The credentials were refused (close 4401, or 401/403 from /v1/token). */
export class AuthError extends Error {}

/** The ws:// or wss:// URL of /v1/listen on the server that served this page. */
export function listenUrl(location) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}/v1/listen?${LISTEN_QUERY}`;
}

/** Trade an API key for a short-lived, single-use token (POST /v1/token; the key goes in a header, never a URL). */
export async function fetchToken(apiKey) {
  const response = await fetch("/v1/token", {
    method: "POST",
    headers: { Authorization: `Bearer ${apiKey}` },
    cache: "no-store",
    credentials: "omit",
  });
  if (response.status === 401 || response.status === 403) throw new AuthError("the API key was refused");
  if (!response.ok) throw new Error(`token request failed: HTTP ${response.status}`);
  const body = await response.json();
  return body.token;
}

export class StreamConnection {
  /**
   * @param {object} options
   * @param {string} options.url /v1/listen URL
   * @param {() => Promise<string[]>} options.protocols subprotocols to offer (the token, if any); may throw AuthError
   * @param {number} [options.startSeconds] where this session starts on the page's timeline (after earlier runs)
   * @param {object} options.on callbacks: ready, partial, final, warning, status(kind, text), done(summary),
   *   fatal({kind, message}) where kind is unauthorized | capacity | unreachable | rejected
   */
  constructor({ url, protocols, on, startSeconds = 0 }) {
    this.url = url;
    this.startSeconds = startSeconds;
    this.protocols = protocols;
    this.on = on;
    this.chunks = []; // {start, pcm}: audio not yet covered by a final, oldest first
    this.produced = 0; // samples given to sendAudio
    this.committed = 0; // end of the last final, in samples of the user session
    this.offset = 0; // where the current connection's stream time 0 sits in the user session
    this.ws = null;
    this.live = false; // `ready` received on the current connection
    this.everReady = false;
    this.ending = false; // no more audio: send `end` once live
    this.closed = false; // done, fatal or cancelled: nothing more happens
    this.attempt = 0;
    this.timer = null;
  }

  start() {
    this.connect();
  }

  /** Queue a chunk (Int16Array of 16 kHz samples) and send it now if connected. */
  sendAudio(pcm) {
    if (this.closed || this.ending) return;
    this.chunks.push({ start: this.produced, pcm });
    this.produced += pcm.length;
    let kept = this.produced - this.chunks[0].start;
    while (kept - this.chunks[0].pcm.length >= REPLAY_SECONDS * SAMPLE_RATE) {
      kept -= this.chunks.shift().pcm.length; // the oldest audio would not be replayed anyway
    }
    if (this.live) this.ws.send(pcm);
  }

  /** No more audio: the server finishes the finals, sends `done` (on.done), and closes. */
  finish() {
    if (this.closed || this.ending) return;
    this.ending = true;
    if (this.live) this.ws.send(JSON.stringify({ type: "end" }));
  }

  /** Stop at once, without waiting for the last finals. */
  cancel() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000, "cancelled");
  }

  get connected() {
    return this.live;
  }

  async connect() {
    let protocols;
    try {
      protocols = await this.protocols();
    } catch (error) {
      if (error instanceof AuthError) return this.fail("unauthorized", "Unauthorised: the API key was refused.");
      return this.retry({ reachable: false }); // fetch failed: the server is down or unreachable
    }
    if (this.closed) return;
    const ws = new WebSocket(this.url, protocols);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    let opened = false;
    let lastError = null;
    ws.onopen = () => {
      opened = true;
    };
    ws.onmessage = (event) => {
      if (typeof event.data !== "string") return;
      const message = JSON.parse(event.data);
      if (message.type === "ready") this.onReady(message);
      else if (message.type === "partial") this.on.partial(this.absolute(message));
      else if (message.type === "final") this.onFinal(message);
      else if (message.type === "done") this.onDone(message);
      else if (message.type === "error") {
        lastError = message;
        if (message.lost) this.on.warning(`Some audio was lost: ${message.message}`);
      }
    };
    ws.onclose = (event) => {
      if (this.ws === ws) {
        this.ws = null;
        this.live = false;
      }
      if (!this.closed) this.onClose(event.code, opened, lastError);
    };
  }

  onReady() {
    this.live = true;
    this.everReady = true;
    this.attempt = 0;
    // replay what no final covers yet; this connection's time 0 is the first sample it gets
    while (this.chunks.length && this.chunks[0].start + this.chunks[0].pcm.length <= this.committed) {
      this.chunks.shift();
    }
    this.offset = this.chunks.length ? Math.max(this.committed, this.chunks[0].start) : this.produced;
    for (const { start, pcm } of this.chunks) {
      this.ws.send(start < this.offset ? pcm.subarray(this.offset - start) : pcm);
    }
    this.on.ready();
    if (this.ending) this.ws.send(JSON.stringify({ type: "end" }));
  }

  absolute(message) {
    const shift = this.startSeconds + this.offset / SAMPLE_RATE;
    return { ...message, start: message.start + shift, end: message.end + shift };
  }

  onFinal(message) {
    const final = this.absolute(message);
    this.committed = Math.max(this.committed, Math.round((final.end - this.startSeconds) * SAMPLE_RATE));
    while (this.chunks.length && this.chunks[0].start + this.chunks[0].pcm.length <= this.committed) {
      this.chunks.shift();
    }
    this.on.final(final);
  }

  onDone(message) {
    this.closed = true;
    this.on.done(message);
  }

  onClose(code, opened, lastError) {
    const reason = lastError?.code;
    if (code === 4401 || reason === "unauthorized") {
      return this.fail("unauthorized", "Unauthorised: this server needs an API key.");
    }
    if ([4400, 4415, 1009].includes(code)) {
      return this.fail("rejected", `The server refused the stream: ${lastError?.message ?? `close ${code}`}.`);
    }
    if (code === 1013 || reason === "at_capacity") {
      if (!this.everReady) return this.fail("capacity", "Server at capacity: try again in a minute.");
      return this.retry({ reachable: true, why: "Server at capacity" });
    }
    if (!opened) return this.retry({ reachable: false });
    if (reason === "shutting_down") return this.retry({ reachable: true, why: "The server is restarting" });
    return this.retry({ reachable: true, why: "Connection lost" });
  }

  retry({ reachable, why }) {
    this.live = false;
    this.attempt += 1;
    const limit = this.everReady ? MAX_ATTEMPTS : FIRST_CONTACT_ATTEMPTS;
    if (this.attempt > limit) {
      return this.fail("unreachable", "Server unreachable: check that `streamer serve` is running, then try again.");
    }
    const delay = Math.min(MAX_DELAY_MS, 500 * 2 ** (this.attempt - 1)) * (0.8 + 0.4 * Math.random());
    const seconds = Math.max(1, Math.round(delay / 1000));
    const what = reachable ? why : "Server unreachable";
    this.on.status("warn", `${what}. Reconnecting in ${seconds} s (attempt ${this.attempt} of ${limit})…`);
    this.timer = setTimeout(() => this.connect(), delay);
  }

  fail(kind, message) {
    this.closed = true;
    this.live = false;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000, "giving up");
    this.on.fatal({ kind, message });
  }
}
