"""ingestion_batch_number: the sequence that leads each new batch id.

Why: a batch id stamps every row of its slice, and the warehouse indexes that stamp. Random
(v4) ids put each new slice's index entries in the middle of the btree, so a load into a
table holding other slices paid a full descent per row (about 1.7 s of server CPU per 1M rows
on PostgreSQL, benchmarks/README.md). The reserve query now writes this sequence's next value
as the id's first 8 hex digits (the rest stays random): each new id sorts after every earlier
one, so its entries take the btree's rightmost-page fast path, and the 8-digit prefixes the
CLI prints stay unique (they are the batch's number).

On a warehouse that already holds slices under random ids, new ids sort below most of them
until those slices are replaced (their index entries then go with them): the gain arrives
as old slices are reloaded. Starting the sequence above the highest existing prefix instead
would leave too few numbers (random prefixes reach ffff....).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Starting after the batches already recorded keeps their prefixes' count in the numbers.
    op.execute("CREATE SEQUENCE ingestion_batch_number AS bigint MINVALUE 1 MAXVALUE 4294967295")
    op.execute(
        "SELECT setval('ingestion_batch_number', count(*) + 1, false) FROM ingestion_batches"
    )


def downgrade() -> None:
    op.execute("DROP SEQUENCE ingestion_batch_number")
