// The page's side of the worker protocol: one Worker, request() -> Promise of the result.
// Relative to this file, which the site serves at its root next to worker/ (any path: https://host/app/).
import { PROTOCOL } from "./worker/protocol.mjs";

export class WorkerError extends Error {
  constructor({ code, message, details }) {
    super(message);
    this.code = code;
    this.details = details;   // e.g. the artifact error {code, where, sentence} of a bad model
  }
}

export class WorkerClient extends EventTarget {
  constructor(url) {
    super();
    this.worker = new Worker(url, { type: "module" });
    this.pending = new Map();   // id -> { resolve, reject }
    this.unmatched = [];        // resolvers waiting for an error reply that carries no id
    this.nextId = 1;
    this.ready = new Promise((resolve, reject) => {
      this.addEventListener("ready", (e) => resolve(e.detail.boot));
      this.addEventListener("boot-failed", (e) => reject(new Error(e.detail.message)));
    });
    this.worker.onmessage = ({ data }) => this.#receive(data);
    this.worker.onerror = (e) => this.dispatchEvent(new CustomEvent("boot-failed", { detail: { message: e.message ?? "worker failed to start" } }));
  }

  #receive(message) {
    if (message?.type === "event") {
      this.dispatchEvent(new CustomEvent(message.event, { detail: message }));
      return;
    }
    if (message?.id === null) {
      this.unmatched.shift()?.(message);
      return;
    }
    const waiter = this.pending.get(message?.id);
    if (!waiter) return;
    this.pending.delete(message.id);
    if (waiter.raw) waiter.resolve(message);
    else if (message.type === "error") waiter.reject(new WorkerError(message.error));
    else waiter.resolve(message.result);
  }

  request(type, fields = {}) {
    return this.start(type, fields).result;
  }

  // Like request(), but the id is known before the reply: events that name their request
  // (delta) can be matched to it. Returns { id, result: Promise }.
  start(type, fields = {}) {
    const id = this.nextId++;
    const result = new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ protocol: PROTOCOL, id, type, ...fields });
    });
    return { id, result };
  }

  // End the worker; requests still waiting for a reply reject with code "cancelled".
  terminate(reason = "the engine's worker was ended") {
    this.worker.terminate();
    for (const waiter of this.pending.values()) {
      if (waiter.raw) waiter.resolve({ type: "error", error: { code: "cancelled", message: reason } });
      else waiter.reject(new WorkerError({ code: "cancelled", message: reason }));
    }
    this.pending.clear();
  }

  // Post anything at all (tests send malformed messages this way) and return the raw reply.
  sendRaw(value) {
    return new Promise((resolve) => {
      const id = value?.id;
      if (Number.isSafeInteger(id) && id >= 0) {
        this.pending.set(id, { resolve, raw: true });
      } else {
        this.unmatched.push(resolve);
      }
      this.worker.postMessage(value);
    });
  }
}
