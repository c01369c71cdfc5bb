"""books and comparisons apart: a kind per session

The Compare tab's runs live in a session of their own kind ("comparison"), so the Library, its rename and
the Write tab's page-load offer see only the writer's books. Sessions the Compare tab made before are
recognised by the title it gave them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 19:50:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0005'
down_revision: Union[str, Sequence[str], None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kind', sa.String(length=20), nullable=False, server_default='book'))
    op.execute("UPDATE sessions SET kind = 'comparison' WHERE title LIKE 'Compare: %'")


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('kind')
