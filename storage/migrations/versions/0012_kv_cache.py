"""the KV cache a draft's runs keep

Which KV cache a draft's run computes its keys and values in (float32, bf16 or q8: tokenswift LoadedModel.kv_cache).
The text depends on it as on the weights' precision, so it is fixed at the first run and a resume keeps it, whatever
a later version or another worker defaults to. Drafts run before this revision have none (NULL): they resume with
the worker's, as before.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 22:30:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0012'
down_revision: Union[str, Sequence[str], None] = '0011'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kv_cache', sa.String(length=20), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.drop_column('kv_cache')
