-- Bulk actions (docs/api-contract.md §20.2): one change applied to a selection of a
-- newsletter's subscribers by the workers, in batches, like imports (§15).
--
-- tags is the tag actions' tags (a JSON array), attributes set_attributes' merge patch (a
-- JSON object, null removing a key), target the selection as the request gave it (a JSON
-- object: a filter, a segment's filter as of the request, or ids). staged is whether its
-- targets are in bulk_action_targets: the first claim stages them, numbered 1 to matched, and
-- fixes matched; processed is the number handled by committed batches, so that a resumed
-- action goes on after it. claim is the token of the worker that holds it until lease_until.
CREATE TABLE bulk_actions (
    id            uuid PRIMARY KEY,
    newsletter_id uuid        NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    action        text        NOT NULL CHECK (action IN ('add_tags', 'remove_tags', 'set_attributes', 'unsubscribe')),
    tags          text        NOT NULL,
    attributes    text        NOT NULL,
    target        text        NOT NULL,
    state         text        NOT NULL CHECK (state IN ('queued', 'running', 'completed', 'cancelled')),
    key_prefix    text        NOT NULL,
    traceparent   text        NOT NULL,
    staged        boolean     NOT NULL DEFAULT false,
    matched       bigint      NOT NULL DEFAULT 0,
    processed     bigint      NOT NULL DEFAULT 0,
    changed       bigint      NOT NULL DEFAULT 0,
    unchanged     bigint      NOT NULL DEFAULT 0,
    claim         uuid,
    lease_until   timestamptz,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    started_at    timestamptz,
    finished_at   timestamptz
);

--bun:split

-- Newest first per newsletter (GET /bulk-actions).
CREATE INDEX bulk_actions_list_idx ON bulk_actions (newsletter_id, created_at DESC, id DESC);

--bun:split

-- The work queue, oldest first.
CREATE INDEX bulk_actions_due_idx ON bulk_actions (created_at, id) WHERE state IN ('queued', 'running');

--bun:split

-- One running action per newsletter: a second claim fails on this index.
CREATE UNIQUE INDEX bulk_actions_one_running_idx ON bulk_actions (newsletter_id) WHERE state = 'running';

--bun:split

-- The subscribers an action acts on, fixed when it starts (INSERT … SELECT in one snapshot),
-- numbered 1 to matched; a batch takes the next numbers and deletes them. No
-- foreign key: written a million at a time, removed when the action finishes.
CREATE TABLE bulk_action_targets (
    action_id     uuid   NOT NULL,
    n             bigint NOT NULL,
    subscriber_id uuid   NOT NULL,
    PRIMARY KEY (action_id, n)
);

--bun:split

-- The attributes as model.Attributes.JSON writes them: compact, keys in code point order,
-- strings escaped as JSON requires and no more (its size is what the 8,192-byte limit counts).
-- A batch that builds events in SQL writes the subscriber's attributes with it (pinned to
-- model.NewEvent by repo's tests).
CREATE FUNCTION subscriber_attributes_text(attributes jsonb) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT '{' || coalesce(string_agg(to_json(k)::text || ':' || v::text, ',' ORDER BY k COLLATE "C"), '') || '}'
    FROM jsonb_each(attributes) AS e (k, v)
$$;
