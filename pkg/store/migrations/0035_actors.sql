-- Who acted on a work item is read from the credential the request came
-- with, never from its body: a tenant (its token; the id is the tenant's),
-- a reviewer or an operator (an operator token of that role; the id is the
-- token's name). Each act also records its route: the tenant API or the
-- console.
--
-- work_actions becomes the record of every act on a work item: the
-- console's redrives, reruns and cancels, and now each claim of its review
-- item and its resolution, whichever route it came through. Every row
-- written before this migration was an operator's, from the console.
ALTER TABLE work_actions
    ADD COLUMN actor_kind text NOT NULL DEFAULT 'operator'
        CONSTRAINT work_actions_actor_kind_check CHECK (actor_kind IN ('tenant', 'reviewer', 'operator')),
    ADD COLUMN route      text NOT NULL DEFAULT 'console'
        CONSTRAINT work_actions_route_check CHECK (route IN ('api', 'console'));
ALTER TABLE work_actions ALTER COLUMN actor_kind DROP DEFAULT, ALTER COLUMN route DROP DEFAULT;
COMMENT ON COLUMN work_actions.by_name IS 'the actor''s id: the tenant''s id, or the operator token''s name';

-- A review item says who resolved it, of which kind and through which
-- route, and of which kind its holder is. An item resolved before this
-- migration keeps resolved_by as its request named it and has no kind or
-- route: that name was never checked against a credential.
ALTER TABLE reviews
    ADD COLUMN resolved_kind  text
        CONSTRAINT reviews_resolved_kind_check CHECK (resolved_kind IN ('tenant', 'reviewer', 'operator')),
    ADD COLUMN resolved_route text
        CONSTRAINT reviews_resolved_route_check CHECK (resolved_route IN ('api', 'console')),
    ADD COLUMN claimed_kind   text
        CONSTRAINT reviews_claimed_kind_check CHECK (claimed_kind IN ('reviewer', 'operator')),
    ADD CONSTRAINT reviews_resolver CHECK ((resolved_kind IS NULL) = (resolved_route IS NULL)
        AND (resolved_kind IS NULL OR state = 'resolved'));
