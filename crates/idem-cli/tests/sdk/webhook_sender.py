"""Sends signed webhooks to a gateway on loopback as their senders do,
signed by the senders' own libraries: the Standard Webhooks library and
the Stripe SDK's signing helper. Each event is delivered several times at
once (a sender retrying a delivery that timed out), then once more,
re-signed with a new timestamp (a later retry), and once with an
Idempotency-Key header of its own (a captured delivery under a chosen key). Then copies of an event
not yet delivered, one signed with the wrong secret and one not signed at
all, are sent before its signed delivery.

Usage: python webhook_sender.py BASE_URL KIND SECRET EVENTS COPIES
KIND is "standard" or "stripe". Prints one JSON line per request:
{"event": id, "try": name, "status": code, "replayed": bool, "body": text}.
"""

import concurrent.futures
import datetime
import json
import sys

import requests
import standardwebhooks
import stripe


def signed(kind, secret, event_id, body):
    """The headers a sender of KIND puts on BODY, signed now."""
    if kind == "standard":
        now = datetime.datetime.now(tz=datetime.timezone.utc)
        signature = standardwebhooks.Webhook(secret).sign(event_id, now, body)
        return {
            "webhook-id": event_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature,
        }
    return {"Stripe-Signature": stripe.WebhookSignature.generate_signature_header(body, secret)}


def event(kind, event_id):
    if kind == "standard":
        return json.dumps({"type": "invoice.paid", "data": {"invoice": event_id}})
    return json.dumps({"id": event_id, "object": "event", "type": "charge.succeeded"})


def send(url, event_id, name, body, headers):
    headers = {"content-type": "application/json", **headers}
    response = requests.post(url, data=body.encode(), headers=headers, timeout=10)
    return {
        "event": event_id,
        "try": name,
        "status": response.status_code,
        "replayed": response.headers.get("idempotent-replayed") == "true",
        "body": response.text,
    }


def main() -> None:
    url, kind, secret = sys.argv[1], sys.argv[2], sys.argv[3]
    events, copies = int(sys.argv[4]), int(sys.argv[5])
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=copies) as pool:
        for n in range(events):
            event_id = f"evt_{n}"
            body = event(kind, event_id)
            headers = signed(kind, secret, event_id, body)
            tries = [
                pool.submit(send, url, event_id, "copy", body, headers) for _ in range(copies)
            ]
            results += [t.result() for t in tries]
            results.append(send(url, event_id, "resigned", body, signed(kind, secret, event_id, body)))
            # A captured delivery sent again under a key of the sender's
            # choosing: the key is read only from what was signed.
            rekeyed = {**headers, "Idempotency-Key": f"chosen-{n}"}
            results.append(send(url, event_id, "rekeyed", body, rekeyed))
    forged_id = "evt_forged"
    body = event(kind, forged_id)
    forged = signed(kind, "whsec_QUFBQUFBQUFBQUFBQUFBQQ==", forged_id, body)
    results.append(send(url, forged_id, "forged", body, forged))
    unsigned = {"webhook-id": forged_id} if kind == "standard" else {}
    results.append(send(url, forged_id, "unsigned", body, unsigned))
    results.append(send(url, forged_id, "signed", body, signed(kind, secret, forged_id, body)))
    for result in results:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
