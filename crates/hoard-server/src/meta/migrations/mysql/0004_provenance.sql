-- Who wrote each entry (its provenance): recorded on the upload at reservation (the subject
-- was already kept as `created_by`) and copied to the entry at finalize. Empty for rows from
-- before: `writer_kind = ''` means "not recorded". Binary strings, as everywhere here.
ALTER TABLE uploads
    ADD COLUMN writer_kind    VARBINARY(16)  NOT NULL DEFAULT '',
    ADD COLUMN writer_issuer  VARBINARY(255) NOT NULL DEFAULT '',
    ADD COLUMN writer_run_id  VARBINARY(255) NOT NULL DEFAULT '',
    ADD COLUMN writer_job_id  VARBINARY(255) NOT NULL DEFAULT '',
    ADD COLUMN writer_address VARBINARY(255) NOT NULL DEFAULT ''
;
-- `digest`: `sha256:<hex>` of a one-chunk entry, `sha256-chunks:<hex>` of its chunks' digests.
ALTER TABLE entries
    ADD COLUMN writer_kind    VARBINARY(16)  NOT NULL DEFAULT '',
    ADD COLUMN writer_issuer  VARBINARY(255) NOT NULL DEFAULT '',
    ADD COLUMN writer_subject VARBINARY(255) NOT NULL DEFAULT '',
    ADD COLUMN writer_run_id  VARBINARY(255) NOT NULL DEFAULT '',
    ADD COLUMN writer_job_id  VARBINARY(255) NOT NULL DEFAULT '',
    ADD COLUMN writer_address VARBINARY(255) NOT NULL DEFAULT '',
    ADD COLUMN digest         VARBINARY(128) NOT NULL DEFAULT ''
;
