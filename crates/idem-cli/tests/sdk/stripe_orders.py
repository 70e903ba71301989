"""Charges orders through the official Stripe Python SDK, pointed at a
gateway on loopback: the SDK adds one Idempotency-Key per call and retries
timeouts, connection errors, 409 and 5xx with backoff, as it does against
the real API.

Usage: python stripe_orders.py BASE_URL ORDERS TIMEOUT_SECONDS MAX_RETRIES
Prints one JSON line per order: {"order": i, "charge": id} or
{"order": i, "error": text, "status": http_status}.
"""

import json
import sys

import stripe


def main() -> None:
    base, orders, timeout, retries = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    client = stripe.StripeClient(
        "sk_test_idem",
        base_addresses={"api": base},
        max_network_retries=retries,
        http_client=stripe.RequestsClient(timeout=timeout),
    )
    for order in range(orders):
        try:
            charge = client.v1.charges.create(
                params={"amount": 1250, "currency": "eur", "description": f"order-{order}"}
            )
            print(json.dumps({"order": order, "charge": charge.id}), flush=True)
        except stripe.StripeError as error:
            print(
                json.dumps({"order": order, "error": str(error), "status": error.http_status}),
                flush=True,
            )


if __name__ == "__main__":
    main()
