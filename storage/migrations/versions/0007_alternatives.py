"""each generated token's likeliest alternatives, per chunk

The Write tab shows the model's other likely tokens at a clicked word and starts a branch from one
(storage/branches.py). The worker stores them with the chunk they belong to, packed (storage/alternatives.py);
chunks written before this revision have none (NULL), and the tab says so.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 10:00:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0007'
down_revision: Union[str, Sequence[str], None] = '0006'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('chunks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('alternatives', sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('chunks', schema=None) as batch_op:
        batch_op.drop_column('alternatives')
