"""who wrote which part of a prompt; the loaded model's size and draft heads

A writer's edit becomes a new draft whose prompt is the edited text: prompt_sources records which parts of
it were the opening, the model's text and the writer's edits; origin tells an edit from a continuation. Workers report their model's parameter
count and the draft heads they loaded, for the model notice; metric points the share of plain steps, for
the speed line.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 09:20:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0003'
down_revision: Union[str, Sequence[str], None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('origin', sa.String(length=20), nullable=True))
        batch_op.add_column(sa.Column('prompt_sources', sa.Text(), nullable=True))
    with op.batch_alter_table('metric_points', schema=None) as batch_op:
        batch_op.add_column(sa.Column('plain_share', sa.Float(), nullable=True))
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('param_count', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('heads_info', sa.String(length=1000), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_column('heads_info')
        batch_op.drop_column('param_count')
    with op.batch_alter_table('metric_points', schema=None) as batch_op:
        batch_op.drop_column('plain_share')
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.drop_column('prompt_sources')
        batch_op.drop_column('origin')
