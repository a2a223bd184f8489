// The transcript of the page: finals only (partials are never kept), with their stream times in seconds from the
// first sample of the user's session (reconnections included), and its text, SRT and WebVTT renderings. The same
// shapes as streamer/offline/formats.py writes for `streamer transcribe`.

export class Transcript {
  constructor() {
    // latencyMs: the server's share; delayMs: the speaker-felt delay (null when it could not be measured)
    // speaker: the server's label (0, 1, ...) when the page asked for speakers, else null or absent
    /** @type {{text: string, start: number, end: number, latencyMs: number | null, delayMs: number | null,
     *   speaker?: number | null}[]} */
    this.finals = [];
  }

  get empty() {
    return !this.finals.some((f) => f.text.trim());
  }

  add(final) {
    this.finals.push(final);
  }

  clear() {
    this.finals = [];
  }

  /** The whole text on one line. */
  toText() {
    return this.finals.map((f) => cueText(f.text)).filter(Boolean).join(" ") + "\n";
  }

  /** SubRip: numbered cues, HH:MM:SS,mmm --> HH:MM:SS,mmm, a blank line after each; "Speaker 1: " before a
   * labelled cue's text. */
  toSrt() {
    return this.cues()
      .map((f, i) => {
        const who = labelled(f) ? `Speaker ${f.speaker + 1}: ` : "";
        return `${i + 1}\n${timestamp(f.start, ",")} --> ${timestamp(f.end, ",")}\n${who}${cueText(f.text)}\n`;
      })
      .join("\n");
  }

  /** WebVTT: the WEBVTT header, then HH:MM:SS.mmm --> HH:MM:SS.mmm cues separated by blank lines; a labelled
   * cue's text in a voice span, <v Speaker 1>. */
  toVtt() {
    const cues = this.cues().map((f) => {
      const text = labelled(f) ? `<v Speaker ${f.speaker + 1}>${cueText(f.text)}` : cueText(f.text);
      return `${timestamp(f.start)} --> ${timestamp(f.end)}\n${text}\n`;
    });
    return ["WEBVTT\n", ...cues].join("\n");
  }

  cues() {
    return this.finals.filter((f) => f.text.trim());
  }
}

function labelled(final) {
  return Number.isInteger(final.speaker);
}

/** HH:MM:SS.mmm (with "," for SRT), rounded to the millisecond; negative times clamp to 0. */
export function timestamp(seconds, marker = ".") {
  let ms = Math.max(0, Math.round(seconds * 1000));
  const hours = Math.floor(ms / 3_600_000);
  ms -= hours * 3_600_000;
  const minutes = Math.floor(ms / 60_000);
  ms -= minutes * 60_000;
  const whole = Math.floor(ms / 1000);
  ms -= whole * 1000;
  const pad = (n, width = 2) => String(n).padStart(width, "0");
  return `${pad(hours)}:${pad(minutes)}:${pad(whole)}${marker}${pad(ms, 3)}`;
}

/** M:SS for the page. */
export function clock(seconds) {
  const whole = Math.max(0, Math.floor(seconds));
  return `${Math.floor(whole / 60)}:${String(whole % 60).padStart(2, "0")}`;
}

// A cue ends at its first blank line, and "-->" in a cue's text would read as a timing line (WebVTT 4.1).
function cueText(text) {
  return text.split(/\s+/).filter(Boolean).join(" ").replaceAll("-->", "->");
}
