"""the precision a draft's runs load the model in, and the kind of device they ran on

Which precision a draft's runs load its model in (q4, float32, bfloat16...: tokenswift LoadedModel.precision) and
on which kind of device (cpu, cuda). The text depends on them, so they are fixed at the first run, as the model is,
and a resume, a continuation or a branch on the same kind of device keeps the precision whatever the worker that
takes the job was started with (before, a q4 draft resumed by a worker started with --dtype float32 went on in
float32, with other text). Drafts run before this revision have none (NULL): they resume with the worker's, as
before.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-30 01:00:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0013'
down_revision: Union[str, Sequence[str], None] = '0012'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('dtype', sa.String(length=50), nullable=True))
        batch_op.add_column(sa.Column('device', sa.String(length=50), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.drop_column('device')
        batch_op.drop_column('dtype')
