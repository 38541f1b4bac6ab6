"""Settings and the warehouse they select."""

from __future__ import annotations

import pytest

from fleet_import.config import Settings
from fleet_import.errors import InvalidInput
from fleet_import.importing.runtime import build_warehouse
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse


def test_redshift_connection_from_a_url_or_from_variables() -> None:
    from_url = Settings(
        warehouse="redshift",
        warehouse_url="redshift://loader:p%40ss@cluster.example:5440/analytics",
    ).redshift_connect_kwargs()
    assert from_url == {
        "host": "cluster.example",
        "port": 5440,
        "database": "analytics",
        "ssl": True,
        "user": "loader",
        "password": "p@ss",
    }
    iam = Settings(
        warehouse="redshift",
        redshift_host="cluster.example",
        redshift_iam=True,
        redshift_cluster_identifier="fleet",
        redshift_region="eu-west-1",
        redshift_db_user="loader",
    ).redshift_connect_kwargs()
    assert iam["iam"] is True and "password" not in iam and iam["port"] == 5439


def test_warehouse_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(build_warehouse(Settings(), s3=None), PostgresWarehouse)
    with pytest.raises(InvalidInput) as missing:
        build_warehouse(Settings(warehouse="redshift"), s3=None)
    for name in ("FLEET_REDSHIFT_HOST", "FLEET_REDSHIFT_IAM_ROLE", "FLEET_REDSHIFT_STAGING_URI"):
        assert name in str(missing.value)
    from fleet_import.s3.client import s3_client
    from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse

    redshift = build_warehouse(
        Settings(
            warehouse="redshift",
            warehouse_url="redshift://loader:secret@cluster.example:5439/dev",
            redshift_iam_role="arn:aws:iam::123456789012:role/copy",
            staging_uri="s3://fleet-staging/x/",
        ),
        s3=s3_client("http://127.0.0.1:9"),
    )
    assert isinstance(redshift, RedshiftWarehouse)
    assert "secret" not in repr(redshift)
