"""a draft's World Info (lorebook) as JSON

World Info entries go into the model's window while their keys appear in the latest story text
(tokenswift/text/world_info.py). A draft keeps its document beside its Memory and Author's Note; drafts made
before this revision have none ('').

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 12:00:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0006'
down_revision: Union[str, Sequence[str], None] = '0005'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('world_info', sa.Text(), nullable=False, server_default=''))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.drop_column('world_info')
