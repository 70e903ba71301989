/**
 * HTTP to idem serve: JSON both ways, problems turned into errors, and
 * retries of what is safe to send again (every call of the API is: a write
 * that already landed is answered as done, and a claim sent twice finds its
 * own claim in progress).
 */

import { ApiError, LeaseLost, Unavailable } from "./errors.js";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export class Transport {
  private readonly base: string;
  private readonly headers: Record<string, string>;

  constructor(
    url: string,
    token: string | undefined,
    private readonly timeoutMs: number,
    private readonly retries: number,
  ) {
    const parsed = new URL(url);
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new TypeError(`idem serve URL ${url}: use http://HOST:PORT or https://HOST:PORT`);
    }
    this.base = url.replace(/\/+$/, "");
    this.headers = { "content-type": "application/json", accept: "application/json" };
    if (token) this.headers.authorization = `Bearer ${token}`;
  }

  /**
   * Sends one request, trying again (`retries` times, the client's by
   * default) after a lost connection or a 502, 503 or 504, and returns the
   * decoded answer (undefined for 204).
   */
  async call(
    method: "GET" | "POST",
    path: string,
    body?: unknown,
    query?: Record<string, string>,
    extraMs = 0,
    tries?: { retries?: number; timeoutMs?: number },
  ): Promise<any> {
    const target = this.base + path + (query ? `?${new URLSearchParams(query)}` : "");
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const retries = tries?.retries ?? this.retries;
    const timeoutMs = tries?.timeoutMs ?? this.timeoutMs;
    let delay = 50;
    for (let attempt = 0; ; attempt++) {
      const last = attempt === retries;
      let response: Response;
      let text: string;
      try {
        response = await fetch(target, {
          method,
          headers: this.headers,
          body: payload,
          signal: AbortSignal.timeout(timeoutMs + extraMs),
        });
        text = await response.text();
      } catch (error) {
        if (last) throw new Unavailable(`idem serve at ${this.base}: ${String(error)}`);
        await sleep(delay * (1 + Math.random()));
        delay = Math.min(delay * 2, 2000);
        continue;
      }
      if (response.status === 204) return undefined;
      let answer: any;
      try {
        answer = text ? JSON.parse(text) : undefined;
      } catch {
        // Not idem serve's own answer: a proxy's page, say.
        answer = undefined;
      }
      if (response.status < 400 && answer !== undefined) return answer;
      const error = new ApiError(
        response.status,
        typeof answer === "object" && answer !== null ? answer : { detail: `${response.status}: ${text.slice(0, 200)}` },
      );
      if (error.kind === "lease-lost") throw new LeaseLost(error.detail);
      if ([502, 503, 504].includes(response.status) && !last) {
        const after = Number(response.headers.get("retry-after") ?? "0") * 1000;
        await sleep(Math.max(after, delay));
        delay = Math.min(delay * 2, 2000);
        continue;
      }
      throw error;
    }
  }
}
