-- Elastic pod groups (issue 18, item 1): a group names a minimum (pod_group_size, released
-- together) and a maximum; 0 is a static group, whose maximum is its size (lockgate.groups).
ALTER TABLE jobs
    ADD COLUMN pod_group_max_size integer NOT NULL DEFAULT 0
        CHECK (pod_group_max_size BETWEEN 0 AND 10000);
