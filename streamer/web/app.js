// The page: microphone or file in, live transcript out. Capture (MicSource, FileSource) produces 16 kHz PCM16
// chunks; StreamConnection (connection.js) carries them over protocol v1; the handlers below draw what comes back.

import {
  fetchReadiness,
  fetchToken,
  listenUrl,
  SAMPLE_RATE,
  StreamConnection,
  TOKEN_SUBPROTOCOL_PREFIX,
} from "./connection.js";
import { toPcm16 } from "./resample.js";
import { clock, Transcript } from "./transcript.js";

const CHUNK_SAMPLES = SAMPLE_RATE / 10; // 100 ms

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"),
  start: $("start"),
  stop: $("stop"),
  level: $("level"),
  drop: $("drop"),
  file: $("file"),
  fileProgress: $("file-progress"),
  auth: $("auth"),
  apiKey: $("api-key"),
  transcript: $("transcript"),
  partial: $("partial"),
  summary: $("summary"),
  downloads: { txt: $("download-txt"), srt: $("download-srt"), vtt: $("download-vtt") },
  clear: $("clear"),
  diarize: $("diarize"),
};

const transcript = new Transcript();
let apiKey = null; // in this tab's memory only: never stored, never in a URL, never logged
let run = null; // the session in progress: {source, connection, label}
let retryAfterAuth = null; // what to start again once the user has given a key

// -- capture --------------------------------------------------------------------------------------------------------

class CaptureError extends Error {}

/** Level in [0, 1] for the meter: -60 dBFS and below is 0, 0 dBFS is 1. */
function level(rms) {
  return rms > 0 ? Math.min(1, Math.max(0, (20 * Math.log10(rms) + 60) / 60)) : 0;
}

class MicSource {
  label = "microphone";

  async start({ chunk }) {
    if (!navigator.mediaDevices?.getUserMedia) {
      throw new CaptureError("The microphone needs a secure page: open this page over https or on localhost.");
    }
    try {
      // raw audio: the browser's echo cancellation and noise suppression distort speech for recognition
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
      });
    } catch (error) {
      throw new CaptureError(describeMicError(error));
    }
    this.context = new AudioContext();
    await this.context.audioWorklet.addModule(new URL("./worklet.js", import.meta.url));
    this.node = new AudioWorkletNode(this.context, "pcm16-capture", { numberOfInputs: 1, numberOfOutputs: 1 });
    this.node.port.onmessage = (event) => {
      if (event.data.pcm) chunk(event.data.pcm, event.data.rms);
      if (event.data.flushed && this.flushed) this.flushed();
    };
    // the worklet writes no output; a muted gain keeps it in the rendered graph in every browser
    const mute = new GainNode(this.context, { gain: 0 });
    this.context.createMediaStreamSource(this.stream).connect(this.node).connect(mute).connect(this.context.destination);
    await this.context.resume();
    for (const track of this.stream.getAudioTracks()) {
      track.onended = () => setStatus("error", "The microphone was disconnected.");
    }
  }

  async stop() {
    if (this.node) {
      // let the worklet hand over its last partial chunk before the graph goes away
      await Promise.race([
        new Promise((resolve) => {
          this.flushed = resolve;
          this.node.port.postMessage("flush");
        }),
        new Promise((resolve) => setTimeout(resolve, 300)),
      ]);
    }
    for (const track of this.stream?.getTracks() ?? []) track.stop();
    await this.context?.close().catch(() => {});
    this.node = null;
  }
}

function describeMicError(error) {
  switch (error?.name) {
    case "NotAllowedError":
    case "SecurityError":
      return "Microphone permission denied: allow the microphone for this page (address bar), then press Start.";
    case "NotFoundError":
    case "OverconstrainedError":
      return "No microphone found: connect one, then press Start.";
    case "NotReadableError":
    case "AbortError":
      return "The microphone cannot be opened: another application may be using it.";
    default:
      return `The microphone cannot be used: ${error?.message ?? error}.`;
  }
}

/** A decoded file, sent at real-time pace as if spoken into the microphone. */
class FileSource {
  constructor(file) {
    this.file = file;
    this.label = file.name;
  }

  async start({ chunk, ended }) {
    let samples;
    try {
      // an OfflineAudioContext at 16 kHz decodes and resamples in one go
      const decoded = await new OfflineAudioContext(1, 1, SAMPLE_RATE).decodeAudioData(await this.file.arrayBuffer());
      samples = mixDown(decoded);
    } catch {
      throw new CaptureError(`Cannot decode ${this.file.name}: choose a WAV, FLAC, MP3, Ogg or M4A file.`);
    }
    const total = samples.length;
    const began = performance.now();
    let sent = 0;
    const tick = () => {
      const due = Math.min(total, Math.floor(((performance.now() - began) / 1000) * SAMPLE_RATE));
      while (due - sent >= CHUNK_SAMPLES || (due === total && sent < total)) {
        const part = samples.subarray(sent, Math.min(total, sent + CHUNK_SAMPLES));
        const pcm = Int16Array.from(part, toPcm16);
        let sumSquares = 0;
        for (const s of part) sumSquares += s * s;
        chunk(pcm, Math.sqrt(sumSquares / part.length));
        sent += part.length;
      }
      ui.fileProgress.textContent = `${clock(sent / SAMPLE_RATE)} / ${clock(total / SAMPLE_RATE)}`;
      if (sent >= total) ended();
      else this.timer = setTimeout(tick, 50);
    };
    tick();
  }

  async stop() {
    clearTimeout(this.timer);
  }
}

function mixDown(buffer) {
  const mono = new Float32Array(buffer.length);
  for (let c = 0; c < buffer.numberOfChannels; c++) {
    const data = buffer.getChannelData(c);
    for (let i = 0; i < data.length; i++) mono[i] += data[i] / buffer.numberOfChannels;
  }
  return mono;
}

// -- a session ------------------------------------------------------------------------------------------------------

async function begin(source) {
  if (run) return;
  retryAfterAuth = null;
  ui.partial.textContent = "";
  ui.summary.textContent = "";
  // a new run continues the page's timeline, so that the downloads stay in order
  const last = transcript.finals.at(-1);
  const startSeconds = last ? Math.ceil(last.end) + 1 : 0;
  if (last) {
    const separator = document.createElement("li");
    separator.className = "run";
    separator.setAttribute("role", "separator");
    separator.setAttribute("aria-label", `new recording: ${source.label}`);
    ui.transcript.append(separator);
  }
  const connection = new StreamConnection({
    url: listenUrl(window.location, { diarize: ui.diarize.checked }),
    startSeconds,
    protocols: async () => (apiKey === null ? [] : [TOKEN_SUBPROTOCOL_PREFIX + (await fetchToken(apiKey))]),
    readiness: fetchReadiness,
    on: {
      ready: ({ reconnected, resumed } = {}) => {
        const doing = source instanceof MicSource ? "Listening: speak now." : `Streaming ${source.label}…`;
        const again = reconnected ? (resumed ? "Reconnected, session resumed. " : "Reconnected, new session. ") : "";
        setStatus("ok", again + doing);
      },
      partial: (message) => {
        ui.partial.textContent = message.text.trim();
      },
      final: addFinal,
      warning: (text) => setStatus("warn", text),
      status: setStatus,
      done: (summary) => finished(summary),
      fatal: (failure) => failed(source, failure),
    },
  });
  run = { source, connection };
  setRunning(true);
  setStatus("info", source instanceof MicSource ? "Starting the microphone…" : `Decoding ${source.label}…`);
  try {
    await source.start({
      chunk: (pcm, rms) => {
        connection.sendAudio(pcm);
        ui.level.value = level(rms);
      },
      ended: () => stop(),
    });
  } catch (error) {
    await source.stop();
    connection.cancel();
    endRun();
    setStatus("error", error instanceof CaptureError ? error.message : `Cannot start: ${error.message ?? error}`);
    return;
  }
  if (run?.connection === connection && !connection.connected) setStatus("info", "Connecting…");
  connection.start();
}

async function stop() {
  if (!run) return;
  const { source, connection } = run;
  ui.stop.disabled = true;
  await source.stop();
  ui.level.value = 0;
  if (connection.connected) {
    setStatus("info", "Finishing the last words…");
    connection.finish(); // `done` (finished) or a failure ends the run
  } else {
    connection.cancel();
    endRun();
    setStatus("warn", "Stopped while disconnected: the audio since the last final was not transcribed.");
  }
}

function addFinal(message) {
  ui.partial.textContent = "";
  const text = message.text.trim();
  if (!text) return;
  const { start, end, latency_ms: latencyMs, delay_ms: delayMs } = message;
  // with "Label speakers": who said most of it (each word has its own, message.words[i].speaker)
  const speaker = Number.isInteger(message.speaker) ? message.speaker : null;
  transcript.add({ text, start, end, latencyMs, delayMs, speaker });
  const item = document.createElement("li");
  item.className = "final";
  item.dataset.start = message.start.toFixed(3);
  item.dataset.end = message.end.toFixed(3);
  const time = document.createElement("span");
  time.className = "time";
  time.textContent = clock(message.start);
  const words = document.createElement("span");
  words.className = "text";
  words.textContent = text;
  const latency = document.createElement("span");
  latency.className = "latency";
  latency.textContent = delayText(message.delay_ms, message.latency_ms);
  latency.title =
    "delay as the speaker felt it: from the moment this page sent the audio of the last word to the moment the " +
    "final arrived; server: its share, from the last audio this text needed to the moment it sent the final";
  if (speaker !== null) {
    const who = document.createElement("span");
    who.className = `speaker speaker-${speaker % 8}`;
    who.textContent = speakerName(speaker);
    item.append(time, who, words, latency);
  } else {
    item.append(time, words, latency);
  }
  ui.transcript.append(item);
  updateDownloads();
}

/** "Speaker 1" for the server's speaker 0. */
function speakerName(speaker) {
  return `Speaker ${speaker + 1}`;
}

/** "0.9 s (server 0.25 s)": the speaker-felt delay, and the server's share labelled as such. */
function delayText(delayMs, serverMs) {
  const server = `server ${(serverMs / 1000).toFixed(2)} s`;
  return delayMs === null || delayMs === undefined ? `(${server})` : `${(delayMs / 1000).toFixed(1)} s (${server})`;
}

function finished(summary) {
  endRun();
  ui.partial.textContent = "";
  const ms = (value) => (value === null || value === undefined ? "–" : `${Math.round(value)} ms`);
  const { partial } = summary.latency;
  const { final_delay_ms: felt, server_final_latency_ms: share } = summary.felt;
  ui.summary.textContent =
    `${summary.audio_seconds_received.toFixed(1)} s of audio. ` +
    `Final delay (speaker-felt): p50 ${ms(felt.p50)}, p95 ${ms(felt.p95)}; ` +
    `server's share: p50 ${ms(share.p50)}, p95 ${ms(share.p95)}. ` +
    `Partials (server's share): p50 ${ms(partial.p50)}, p95 ${ms(partial.p95)}.`;
  setStatus("ok", "Done.");
}

async function failed(source, failure) {
  await source.stop();
  endRun();
  setStatus("error", failure.message);
  if (failure.kind === "unauthorized") {
    apiKey = null;
    retryAfterAuth = source instanceof FileSource ? () => begin(new FileSource(source.file)) : () => begin(new MicSource());
    ui.auth.hidden = false;
    ui.apiKey.focus();
  }
}

function endRun() {
  run = null;
  ui.level.value = 0;
  setRunning(false);
}

// -- the page -------------------------------------------------------------------------------------------------------

function setStatus(kind, text) {
  ui.status.dataset.kind = kind;
  ui.status.textContent = text;
}

function setRunning(running) {
  ui.start.disabled = running;
  ui.stop.disabled = !running;
  ui.file.disabled = running;
  ui.clear.disabled = running || transcript.empty;
}

function updateDownloads() {
  for (const button of Object.values(ui.downloads)) button.disabled = transcript.empty;
  ui.clear.disabled = Boolean(run) || transcript.empty;
}

function download(extension, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = document.createElement("a");
  link.href = url;
  link.download = `transcript-${new Date().toISOString().slice(0, 19).replaceAll(":", "-")}.${extension}`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function chooseFile(file) {
  if (!file || run) return;
  ui.fileProgress.textContent = "";
  begin(new FileSource(file));
}

ui.start.addEventListener("click", () => begin(new MicSource()));
ui.stop.addEventListener("click", () => stop());
ui.file.addEventListener("change", () => {
  chooseFile(ui.file.files[0]);
  ui.file.value = ""; // choosing the same file again starts again
});
ui.downloads.txt.addEventListener("click", () => download("txt", transcript.toText(), "text/plain"));
ui.downloads.srt.addEventListener("click", () => download("srt", transcript.toSrt(), "application/x-subrip"));
ui.downloads.vtt.addEventListener("click", () => download("vtt", transcript.toVtt(), "text/vtt"));
ui.clear.addEventListener("click", () => {
  transcript.clear();
  ui.transcript.replaceChildren();
  ui.summary.textContent = "";
  updateDownloads();
});
ui.auth.addEventListener("submit", (event) => {
  event.preventDefault();
  apiKey = ui.apiKey.value.trim() || null;
  ui.apiKey.value = "";
  ui.auth.hidden = true;
  const again = retryAfterAuth;
  retryAfterAuth = null;
  if (apiKey !== null && again) again();
});

// a file dropped anywhere on the page is transcribed, not opened by the browser
for (const type of ["dragenter", "dragover"]) {
  document.addEventListener(type, (event) => {
    event.preventDefault();
    ui.drop.classList.add("over");
  });
}
for (const type of ["dragleave", "drop"]) {
  document.addEventListener(type, (event) => {
    event.preventDefault();
    if (type === "drop" || event.relatedTarget === null) ui.drop.classList.remove("over");
  });
}
document.addEventListener("drop", (event) => chooseFile(event.dataTransfer?.files?.[0]));

setRunning(false);
updateDownloads();
setStatus("info", "Ready: press Start microphone, or choose an audio file.");
