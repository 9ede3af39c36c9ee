-- Every change to a tenant or its tokens is told, at its commit, on the
-- channel assay_tenant_changed with the tenant's id: ingress keeps a
-- token's tenant for minutes and forgets it the moment it changes
-- (rotated, revoked, suspended, rate or home changed), whoever changed it.
CREATE FUNCTION notify_tenant_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('assay_tenant_changed', OLD.id);
    ELSE
        PERFORM pg_notify('assay_tenant_changed', NEW.id);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION notify_tenant_token_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('assay_tenant_changed', OLD.tenant_id);
    ELSE
        PERFORM pg_notify('assay_tenant_changed', NEW.tenant_id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER tenant_changed AFTER INSERT OR UPDATE OR DELETE ON tenants
    FOR EACH ROW EXECUTE FUNCTION notify_tenant_changed();
CREATE TRIGGER tenant_token_changed AFTER INSERT OR UPDATE OR DELETE ON tenant_tokens
    FOR EACH ROW EXECUTE FUNCTION notify_tenant_token_changed();
