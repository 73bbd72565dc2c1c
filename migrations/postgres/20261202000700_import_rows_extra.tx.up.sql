-- An NDJSON import line's attributes and tags (docs/api-contract.md §19.2), staged at the
-- upload with the rest of the row: the JSON object {"attributes": {...}, "tags": [...]} exactly
-- as the created event writes the subscriber's two fields (model.NewEvent), NULL when the line
-- has neither. The batch stores both from it and splices it into the event.
ALTER TABLE import_rows ADD COLUMN extra text;
