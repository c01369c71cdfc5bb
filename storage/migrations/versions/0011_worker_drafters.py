"""the drafters a worker's model has

What the worker's loaded model drafts with, as facts (tokenswift/draft/choice.py Drafters, JSON): its draft heads,
draft layer and draft model, what auto picks, and where a draft layer trained for it would be found. The Model tab
words them, and says how to train a draft layer where the model has none. Workers that reported before this revision
have none (NULL) until they load a model again.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 10:00:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0011'
down_revision: Union[str, Sequence[str], None] = '0010'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('drafters', sa.Text(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_column('drafters')
