// One user session of protocol v1 (docs/protocol.md) over as many WebSocket connections as it takes.
//
// Audio goes in as 16 kHz PCM16 chunks (sendAudio); transcript events come out through the `on` callbacks with
// times in seconds of the user's session, whichever connection produced them. When a connection drops mid-session
// the session reconnects with a jittered exponential back-off and asks to resume (?resume=<id>&last_seq=<n>) on
// whichever replica answers: the finals it missed come again (those it had are dropped by seq), and it sends its
// audio again from the `resume_from` the server names (a replica taking the session over names the open
// utterance's start, up to 30 s before the last final: context it re-reads; `resend_from` says what is still held). If the session is gone everywhere (4404), a new one starts
// from the end of the last final, its times and seqs continuing the first. The same rules as streamer.reconnect
// (the Python client); docs/operations.md, "Clients across failures", gives the figures.
//
// Latency is what the speaker feels: a SendLog notes when each chunk was handed over, so each final arrives with
// `delay_ms`, from the sending of the audio of its last word to its arrival on this page's clock, beside the server's
// share (`latency_ms`); `done` carries their percentiles (`felt`). A resend after a resume is not noted again.

export const SAMPLE_RATE = 16000;
export const LISTEN_QUERY = "sample_rate=16000&encoding=pcm_s16le&channels=1";
export const TOKEN_SUBPROTOCOL_PREFIX = "streamer.token.";

// Audio kept for a resume: from CONTEXT_SECONDS before the end of the last final (the open utterance's context,
// which a replica taking the session over re-reads) to the newest, at most BUFFER_SECONDS; past that the oldest
// goes, and the resume says where the ring starts (resend_from). Only what no final covers is lost if asked for.
export const BUFFER_SECONDS = 60;
export const CONTEXT_SECONDS = 30;
// Back-off: FIRST_DELAY_MS doubling up to MAX_DELAY_MS, each delay drawn in [(1 - JITTER) * d, d]; at most
// MAX_ATTEMPTS attempts in a row or MAX_RECONNECT_MS since the drop. A first contact that was never answered gets
// FIRST_CONTACT_ATTEMPTS; one the server answered with "later" (at capacity, or not ready: /readyz says 503 while it
// loads its model or drains) gets the whole back-off, as the Python client's first connection does.
export const FIRST_DELAY_MS = 250;
export const MAX_DELAY_MS = 5_000;
export const JITTER = 0.5;
export const MAX_ATTEMPTS = 10;
export const MAX_RECONNECT_MS = 60_000;
const FIRST_CONTACT_ATTEMPTS = 2; // a server that never answered gets fewer tries than one that dropped us

// The send log keeps at most this much audio behind the newest chunk (a long silence brings no final to prune it by):
// streamer.reconnect.SEND_LOG_SECONDS.
export const SEND_LOG_SECONDS = 600;

/**
 * When each sample of the user session was first sent (performance.now() milliseconds): chunks ending (exclusive) at
 * `ends[i]`, sent at `times[i]`. Sans-I/O, like streamer.reconnect.SendLog: record() each chunk as it is handed over,
 * sentAt() a final's last word end when it arrives, prune() what no later final can refer to.
 */
export class SendLog {
  constructor(horizon = SEND_LOG_SECONDS * SAMPLE_RATE) {
    this.horizon = horizon;
    this.ends = [];
    this.times = [];
    this.first = 0; // entries before it are pruned; the arrays are compacted once half of them is dead
    this.start = 0; // the first sample still held
    this.end = 0; // samples recorded in all
  }

  record(samples, at) {
    if (samples <= 0) return;
    this.end += samples;
    this.ends.push(this.end);
    this.times.push(at);
    this.prune(this.end - this.horizon + 1);
  }

  /** When the audio ending at `seconds` of the user session went out (the chunk of the sample just before it). */
  sentAt(seconds) {
    const sample = Math.max(0, Math.round(seconds * SAMPLE_RATE) - 1);
    if (sample < this.start) return null;
    let low = this.first;
    let high = this.ends.length;
    while (low < high) {
      const middle = (low + high) >> 1;
      if (this.ends[middle] <= sample) low = middle + 1;
      else high = middle;
    }
    return low < this.ends.length ? this.times[low] : null;
  }

  /** No final will refer to audio ending before sample `upto`: drop the chunks before the one holding `upto - 1`. */
  prune(upto) {
    while (this.first < this.ends.length && this.ends[this.first] < upto) {
      this.start = this.ends[this.first];
      this.first += 1;
    }
    if (this.first > 64 && 2 * this.first > this.ends.length) {
      this.ends.splice(0, this.first);
      this.times.splice(0, this.first);
      this.first = 0;
    }
  }
}

/** The `q`-th percentile (0-100) by linear interpolation, or null for none: streamer.server.metrics.percentile. */
export function percentile(values, q) {
  if (!values.length) return null;
  const ordered = [...values].sort((a, b) => a - b);
  const rank = ((ordered.length - 1) * q) / 100;
  const low = Math.floor(rank);
  const high = Math.min(low + 1, ordered.length - 1);
  return ordered[low] + (ordered[high] - ordered[low]) * (rank - low);
}

/** The delay before attempt `attempt` (1, 2, ...), given a random number in [0, 1). */
export function backoffDelay(attempt, random) {
  const ceiling = Math.min(MAX_DELAY_MS, FIRST_DELAY_MS * 2 ** (attempt - 1));
  return ceiling * (1 - JITTER * random);
}

/**
 * The audio a session may have to send again: chunks {start, pcm} of 16 kHz samples, oldest first, at most
 * `capacity` samples. Sans-I/O, like streamer.reconnect.AudioRing.
 */
export class AudioRing {
  constructor(capacity = BUFFER_SECONDS * SAMPLE_RATE) {
    this.capacity = capacity;
    this.chunks = [];
    this.end = 0; // samples appended in all
    this.dropped = 0; // samples dropped for room before a final released them
  }

  get start() {
    return this.chunks.length ? this.chunks[0].start : this.end;
  }

  append(pcm) {
    this.chunks.push({ start: this.end, pcm });
    this.end += pcm.length;
    while (this.end - this.start > this.capacity) {
      const over = this.end - this.start - this.capacity;
      const head = this.chunks[0];
      if (head.pcm.length <= over) {
        this.chunks.shift();
        this.dropped += head.pcm.length;
      } else {
        this.chunks[0] = { start: head.start + over, pcm: head.pcm.subarray(over) };
        this.dropped += over;
      }
    }
  }

  /** Samples before `upto` are final: no resume will ask for them. */
  release(upto) {
    while (this.chunks.length && this.chunks[0].start < upto) {
      const head = this.chunks[0];
      if (head.start + head.pcm.length <= upto) this.chunks.shift();
      else this.chunks[0] = { start: upto, pcm: head.pcm.subarray(upto - head.start) };
    }
  }

  /** What to send from sample `from`: `silence` samples no longer held (lost), then the `pieces`. */
  replay(from) {
    const silence = Math.max(0, this.start - from);
    const pieces = [];
    for (const { start, pcm } of this.chunks) {
      if (start + pcm.length <= from) continue;
      pieces.push(start < from ? pcm.subarray(from - start) : pcm);
    }
    return { silence, pieces };
  }
}

/** The credentials were refused (close 4401, or 401/403 from /v1/token). */
export class AuthError extends Error {}

/** The ws:// or wss:// URL of /v1/listen on the server that served this page. */
export function listenUrl(location, { diarize = false } = {}) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}/v1/listen?${LISTEN_QUERY}${diarize ? "&diarize=true" : ""}`;
}

/**
 * Whether the server that served this page is ready to stream (GET /readyz): {ready, why}, where `why` is the body
 * of a 503 ("loading the model", "draining"). Throws when the server cannot be reached.
 */
export async function fetchReadiness() {
  const response = await fetch("/readyz", { cache: "no-store", credentials: "omit" });
  return { ready: response.ok, why: response.ok ? "" : (await response.text()).trim() };
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

// How a run that gives up ends (on.fatal), by the last reason it had to try again.
const UNREACHABLE = {
  kind: "unreachable",
  message: "Server unreachable: check that `streamer serve` is running, then try again.",
};
const AT_CAPACITY = { kind: "capacity", message: "Server at capacity: try again in a minute." };
const NOT_READY = { kind: "unready", message: "The server is not ready to stream yet: try again in a minute." };

export class StreamConnection {
  /**
   * @param {object} options
   * @param {string} options.url /v1/listen URL
   * @param {() => Promise<string[]>} options.protocols subprotocols to offer (the token, if any); may throw AuthError
   * @param {number} [options.startSeconds] where this session starts on the page's timeline (after earlier runs)
   * @param {() => Promise<{ready: boolean, why: string}>} [options.readiness] asked when a first handshake fails:
   *   the browser does not show a refused handshake's HTTP status, so this tells a server that is up but not ready
   *   (503 while loading its model) from one that cannot be reached; throws for the latter (see fetchReadiness)
   * @param {(attempt: number, random: number) => number} [options.delay] the back-off (tests shorten it)
   * @param {() => number} [options.now] the clock of the speaker-felt delays, in milliseconds
   * @param {object} options.on callbacks: ready, partial, final (with `delay_ms`, speaker-felt, or null when it
   *   could not be measured), warning, status(kind, text), done(summary, with `felt`: {final_delay_ms,
   *   server_final_latency_ms}, each {p50, p95}), fatal({kind, message}) where kind is unauthorized | capacity |
   *   unready | unreachable | rejected
   */
  constructor({ url, protocols, on, startSeconds = 0, readiness = null, delay = backoffDelay, now = null }) {
    this.url = url;
    this.readiness = readiness;
    this.delay = delay;
    this.startSeconds = startSeconds;
    this.protocols = protocols;
    this.on = on;
    this.ring = new AudioRing(); // audio a resume may ask for again
    this.now = now ?? (() => performance.now());
    this.sendLog = new SendLog(); // when each sample was first sent
    this.delays = []; // {felt, server} milliseconds of each final with text whose delay was measured
    this.committed = 0; // end of the last final, in samples of the user session
    this.offset = 0; // where the current server session's stream time 0 sits in the user session
    this.sessionId = null; // the server session to resume
    this.lastSeq = 0; // the seq of the last final received, in the current server session's numbering
    this.seqBase = 0; // finals of earlier server sessions (after a refused resume)
    this.lost = []; // [start, end] seconds a resume asked for that the ring no longer held
    this.droppedAt = null; // when the connection dropped (ms), for the back-off's time bound
    this.ws = null;
    this.live = false; // `ready` received on the current connection
    this.everReady = false;
    this.answered = false; // the server said "later" on first contact: it gets the whole back-off
    this.ending = false; // no more audio: send `end` once live
    this.closed = false; // done, fatal or cancelled: nothing more happens
    this.attempt = 0;
    this.timer = null;
  }

  start() {
    this.connect();
  }

  /** Queue a chunk (Int16Array of 16 kHz samples) and send it now if connected; `at` is when it was captured. */
  sendAudio(pcm, at = this.now()) {
    if (this.closed || this.ending) return;
    this.ring.append(pcm);
    this.sendLog.record(pcm.length, at);
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
    const resume = this.sessionId ? `&${this.resumeQuery()}` : "";
    const ws = new WebSocket(this.url + resume, protocols);
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

  /** ?resume=...&last_seq=...[&resend_from=...]: the session, the last final received, the oldest audio held. */
  resumeQuery() {
    let query = `resume=${this.sessionId}&last_seq=${this.lastSeq}`;
    const held = Math.max(0, this.ring.start - this.offset);
    if (held) query += `&resend_from=${(held / SAMPLE_RATE).toFixed(6)}`;
    return query;
  }

  onReady(message) {
    const reconnected = this.everReady;
    this.live = true;
    this.everReady = true;
    this.attempt = 0;
    this.droppedAt = null;
    let from;
    if (message.resumed) {
      // the same session, on this replica or taken over by it: send again from where it says
      from = this.offset + Math.round(message.resume_from * SAMPLE_RATE);
    } else {
      // a new server session (the first, or after a refused resume): it starts at the end of the last final
      if (this.sessionId === null && reconnected) {
        this.seqBase += this.lastSeq;
        this.lastSeq = 0;
      }
      this.offset = this.committed;
      from = this.committed;
    }
    this.sessionId = message.session_id;
    const { silence, pieces } = this.ring.replay(from);
    if (silence) this.ws.send(new Int16Array(silence)); // audio the ring dropped: silence keeps the stream time exact
    const lostFrom = Math.max(from, this.committed); // before the last final it was context only, not lost
    if (from + silence > lostFrom) {
      const seconds = (from + silence - lostFrom) / SAMPLE_RATE;
      this.lost.push([lostFrom / SAMPLE_RATE + this.startSeconds, (from + silence) / SAMPLE_RATE + this.startSeconds]);
      this.on.warning(`${seconds.toFixed(1)} s of audio was lost while reconnecting.`);
    }
    for (const pcm of pieces) this.ws.send(pcm);
    this.on.ready({ reconnected, resumed: Boolean(message.resumed) });
    if (this.ending) this.ws.send(JSON.stringify({ type: "end" }));
  }

  absolute(message) {
    const shift = this.startSeconds + this.offset / SAMPLE_RATE;
    return { ...message, start: message.start + shift, end: message.end + shift };
  }

  onFinal(message) {
    if (message.seq && message.seq <= this.lastSeq) return; // received before the reconnect, replayed on resume
    this.lastSeq = Math.max(this.lastSeq, message.seq || 0);
    const final = { ...this.absolute(message), seq: (message.seq || 0) + this.seqBase };
    this.committed = Math.max(this.committed, Math.round((final.end - this.startSeconds) * SAMPLE_RATE));
    this.ring.release(this.committed - CONTEXT_SECONDS * SAMPLE_RATE);
    final.delay_ms = this.measure(message);
    this.sendLog.prune(this.committed);
    this.on.final(final);
  }

  /** The speaker-felt delay of a final just arrived: now minus the sending of its last word's end; null if unknown. */
  measure(message) {
    if (!message.text?.trim()) return null;
    const words = message.words ?? [];
    const end = (words.length ? words[words.length - 1].end : message.end) + this.offset / SAMPLE_RATE;
    const sent = this.sendLog.sentAt(end);
    if (sent === null) return null;
    const felt = this.now() - sent;
    this.delays.push({ felt, server: message.latency_ms });
    return felt;
  }

  onDone(message) {
    this.closed = true;
    const of = (key) => {
      const values = this.delays.map((d) => d[key]);
      return { p50: percentile(values, 50), p95: percentile(values, 95) };
    };
    this.on.done({ ...message, felt: { final_delay_ms: of("felt"), server_final_latency_ms: of("server") } });
  }

  onClose(code, opened, lastError) {
    const reason = lastError?.code;
    if (code === 4401 || reason === "unauthorized") {
      return this.fail("unauthorized", "Unauthorised: this server needs an API key.");
    }
    if (code === 4404 || reason === "unknown_session") {
      // the session is gone everywhere: start a new one at once, from the end of the last final
      this.sessionId = null;
      return this.retry({ reachable: true, why: "The session ended on the server", now: true });
    }
    if ([4400, 4415, 1009].includes(code)) {
      return this.fail("rejected", `The server refused the stream: ${lastError?.message ?? `close ${code}`}.`);
    }
    if (code === 1013 || reason === "at_capacity") {
      this.answered = true;
      return this.retry({ reachable: true, why: "Server at capacity", failure: AT_CAPACITY });
    }
    if (!opened) return this.refused();
    if (reason === "shutting_down") return this.retry({ reachable: true, why: "The server is restarting" });
    return this.retry({ reachable: true, why: "Connection lost" });
  }

  /**
   * The handshake failed before the connection opened: on first contact, ask whether the server is up but not ready
   * (503 while it loads its model), which is worth the whole back-off, or cannot be reached at all.
   */
  async refused() {
    if (!this.everReady && this.readiness) {
      let readiness = null;
      try {
        readiness = await this.readiness();
      } catch {
        // unreachable: as if it had not been asked
      }
      if (this.closed) return;
      if (readiness && !readiness.ready) {
        this.answered = true;
        const why = readiness.why === "draining" ? "The server is restarting" : "The server is loading its model";
        return this.retry({ reachable: true, why, failure: NOT_READY });
      }
    }
    return this.retry({ reachable: false });
  }

  retry({ reachable, why, now = false, failure = UNREACHABLE }) {
    this.live = false;
    if (this.droppedAt === null) this.droppedAt = Date.now();
    if (!now) this.attempt += 1;
    const limit = this.everReady || this.answered ? MAX_ATTEMPTS : FIRST_CONTACT_ATTEMPTS;
    if (this.attempt > limit || Date.now() - this.droppedAt > MAX_RECONNECT_MS) {
      return this.fail(failure.kind, failure.message);
    }
    const delay = now ? 0 : this.delay(this.attempt, Math.random());
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
