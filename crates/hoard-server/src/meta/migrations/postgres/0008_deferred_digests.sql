-- Chunks of more than 1 MiB on local disk are written with their XXH3-64 only: their SHA-256
-- (an empty value until then) and their entry's digest are recorded afterwards by the digest
-- pass, which finds the entries still without a digest through this index. Servers older than
-- this migration would take an empty SHA-256 for damage, so they must not open this database.
CREATE INDEX entries_awaiting_digest ON entries (id) WHERE digest = '';
