"""a draft's Memory and Author's Note; the context in view and the shifts in metric points

Drafts longer than the model's context shift it (tokenswift/text/context_window.py): the Memory stays pinned at
the top, the Author's Note sits near the end. Metric points record what the model saw and the shifts so far,
for the status line and the bench.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 13:00:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0004'
down_revision: Union[str, Sequence[str], None] = '0003'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('memory', sa.Text(), nullable=False, server_default=''))
        batch_op.add_column(sa.Column('authors_note', sa.Text(), nullable=False, server_default=''))
    with op.batch_alter_table('metric_points', schema=None) as batch_op:
        batch_op.add_column(sa.Column('context_pinned', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('context_recent', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('shifts', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('shift_s', sa.Float(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('metric_points', schema=None) as batch_op:
        batch_op.drop_column('shift_s')
        batch_op.drop_column('shifts')
        batch_op.drop_column('context_recent')
        batch_op.drop_column('context_pinned')
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.drop_column('authors_note')
        batch_op.drop_column('memory')
