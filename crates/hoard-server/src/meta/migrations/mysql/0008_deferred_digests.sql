-- Chunks of more than 1 MiB on local disk are written with their XXH3-64 only: their SHA-256
-- (32 zero bytes until then) and their entry's digest are recorded afterwards by the digest
-- pass, which finds the entries still without a digest through this index. Servers older than
-- this migration would take a zero SHA-256 for damage, so they must not open this database.
CREATE INDEX entries_awaiting_digest ON entries (digest(1), id)
;
