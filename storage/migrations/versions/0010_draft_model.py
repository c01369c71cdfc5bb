"""the chosen model's draft model

A smaller model with the chosen model's tokenizer that drafts for it (tokenswift/draft/model_drafter.py), chosen in
the Model tab beside the model. A speed option only: the text is the same with or without it. Choices made before
this revision have none (NULL).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 21:20:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0010'
down_revision: Union[str, Sequence[str], None] = '0009'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('desired_model', schema=None) as batch_op:
        batch_op.add_column(sa.Column('draft_model', sa.String(length=1000), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('desired_model', schema=None) as batch_op:
        batch_op.drop_column('draft_model')
