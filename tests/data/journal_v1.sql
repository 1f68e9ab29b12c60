-- A payonce journal exactly as schema version 1 wrote it (payonce 0.1 before the
-- schema-2 migration): the version-1 DDL copied from src/payonce/_journal/_schema.py
-- MIGRATIONS[0], its meta rows, one succeeded intent with its stored 201 response and
-- two attempts, and one pending intent whose only attempt never ended.
--
-- Used by tests/test_journal.py (schema migration). Do not regenerate it from the
-- current schema: its whole point is to stay what an old payonce left on disk.
--
-- Both fingerprints are literals computed once with payonce's own canonical form:
--
--   from payonce._lifecycle import canonical_request
--   for amount in (4200, 1500):
--       c = canonical_request("POST", "/v1/payments",
--                             json_body={"amount": amount, "currency": "eur"})
--       print(amount, c.fingerprint, c.body.hex().upper())
--
-- The stored response body is raw bytes (UTF-8 "café €" and a trailing newline), so a
-- replay can be compared byte for byte:
--   {"id":"pay_v1fixture00000000000001","object":"payment","account":"acct_demo","amount":4200,"currency":"eur","reference":null,"status":"succeeded","description":"café €","metadata":{}}

CREATE TABLE payonce_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE intents (
    key TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    reference TEXT,
    account TEXT NOT NULL,
    provider TEXT NOT NULL,
    method TEXT NOT NULL,
    url TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    request_headers TEXT NOT NULL,
    request_body BLOB NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    first_sent_at REAL,
    lease_owner TEXT,
    lease_expires_at REAL,
    response_status INTEGER,
    response_headers TEXT,
    response_body BLOB
);
CREATE UNIQUE INDEX intents_scope_reference ON intents (scope, reference) WHERE reference IS NOT NULL;
CREATE TABLE attempts (
    key TEXT NOT NULL REFERENCES intents (key) ON DELETE CASCADE,
    number INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    status_code INTEGER,
    error TEXT,
    PRIMARY KEY (key, number)
);

INSERT INTO payonce_meta VALUES ('application', 'payonce'), ('schema_version', '1');

-- Succeeded: sent twice (a 503, then the 201 that is stored and must be replayed).
INSERT INTO intents VALUES (
    '01JGFJJZ0000000000000000A1',
    'acct_demo POST /v1/payments',
    'order-v1-0001',
    'acct_demo',
    'sandbox',
    'POST',
    'http://127.0.0.1:9/v1/payments',
    'd4e572ddb63b475ef7c012a6b9530829c13244a2d380e25411cd3ef6beae3a8c',
    '[["content-type","application/json"]]',
    X'7B22616D6F756E74223A343230302C2263757272656E6379223A22657572227D',
    'succeeded',
    1767225600.0,
    1767225601.5,
    1767225600.0,
    NULL,
    NULL,
    201,
    '[["content-type","application/json"],["request-id","req_v1fixture"]]',
    X'7B226964223A227061795F7631666978747572653030303030303030303030303031222C226F626A656374223A227061796D656E74222C226163636F756E74223A22616363745F64656D6F222C22616D6F756E74223A343230302C2263757272656E6379223A22657572222C227265666572656E6365223A6E756C6C2C22737461747573223A22737563636565646564222C226465736372697074696F6E223A22636166C3A920E282AC222C226D65746164617461223A7B7D7D0A'
);
INSERT INTO attempts VALUES
    ('01JGFJJZ0000000000000000A1', 1, 1767225600.0, 1767225600.75, 503, NULL),
    ('01JGFJJZ0000000000000000A1', 2, 1767225601.0, 1767225601.5, 201, NULL);

-- Pending: its first attempt was in flight when that payonce stopped.
INSERT INTO intents VALUES (
    '01JGFJJZ0000000000000000B2',
    'acct_demo POST /v1/payments',
    'order-v1-0002',
    'acct_demo',
    'sandbox',
    'POST',
    'http://127.0.0.1:9/v1/payments',
    '27ee78a6591ec0c108b13e23aeb9b9525b96306f598c772a65c739cb8c45bd8b',
    '[["content-type","application/json"]]',
    X'7B22616D6F756E74223A313530302C2263757272656E6379223A22657572227D',
    'pending',
    1767225700.0,
    1767225700.0,
    1767225700.0,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL
);
INSERT INTO attempts VALUES ('01JGFJJZ0000000000000000B2', 1, 1767225700.0, NULL, NULL, NULL);
