import payonce
URL = open("/tmp/r17/plain.url").read().strip()
client = payonce.Client(
    base_url=URL,
    provider="generic",          # or "sandbox", or your own payonce.ProviderProfile
    account="acct_42",           # API key: api_key=, else PAYONCE_API_KEY, else the OS keyring
    journal="/tmp/r17/j-use.db",
)

with client.intent("order-cmd_9182") as op:       # same reference => same key, even after a restart
    response = op.post("/v1/payments", json={"amount": 4200, "currency": "eur"})
    print(op.key, op.state)                       # the intent's key and journal state

# one-shot form
response = client.post("/v1/payments", json={"amount": 4200, "currency": "eur"},
                       reference="order-cmd_9182")
print(payonce.response_info(response).replayed)          # True: served from the journal
