"""Model backends: each implements `collapsecheck.engines.backends.base.Backend`; the registry
(`registry`) names them and imports a backend's module only when it is used."""
