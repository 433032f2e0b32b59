-- Who wrote each entry (its provenance): recorded on the upload at reservation (the subject
-- was already kept as `created_by`) and copied to the entry at finalize. Empty for rows from
-- before: `writer_kind = ''` means "not recorded".
ALTER TABLE uploads ADD COLUMN writer_kind TEXT NOT NULL DEFAULT '';
ALTER TABLE uploads ADD COLUMN writer_issuer TEXT NOT NULL DEFAULT '';
ALTER TABLE uploads ADD COLUMN writer_run_id TEXT NOT NULL DEFAULT '';
ALTER TABLE uploads ADD COLUMN writer_job_id TEXT NOT NULL DEFAULT '';
ALTER TABLE uploads ADD COLUMN writer_address TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN writer_kind TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN writer_issuer TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN writer_subject TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN writer_run_id TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN writer_job_id TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN writer_address TEXT NOT NULL DEFAULT '';
-- `sha256:<hex>` of a one-chunk entry, `sha256-chunks:<hex>` of its chunks' digests otherwise.
ALTER TABLE entries ADD COLUMN digest TEXT NOT NULL DEFAULT '';
