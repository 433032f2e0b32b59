-- Every change to an upload bumps its revision; the domain's decisions apply only at the
-- revision they were made on (compare-and-set).
ALTER TABLE uploads ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;
